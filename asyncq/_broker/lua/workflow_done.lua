-- include: counters, step_ack
-- asyncq workflows: acknowledge a step of a workflow and, in the same script, record
-- its outcome in the workflow hash and enqueue the next stage when this was the
-- stage's last member. Used only for tasks carrying the asyncq-workflow header.
-- KEYS[1] active            KEYS[2] lease              KEYS[3] task key
-- KEYS[4] processed:<day>   KEYS[5] processed (all)    KEYS[6] completed
-- KEYS[7] archived          KEYS[8] failed:<day>       KEYS[9] failed (all)
-- KEYS[10] task key prefix of the step's queue         KEYS[11] workflow hash
-- ARGV[1] task id    ARGV[2] mode: done | complete | archive | revoke
-- ARGV[3] expiry of the daily counters (unix s)   ARGV[4] max int64   ARGV[5] now (unix s)
-- ARGV[6] msg to store (complete: completed_at set; archive: error set)
-- ARGV[7] completed score (complete)   ARGV[8] stage   ARGV[9] member index
-- ARGV[10] error message (archive/revoke)   ARGV[11] archive cutoff (unix s)
-- ARGV[12] archive size limit   ARGV[13] now (unix ns, pending_since)
-- The workflow part is advance() (workflow_advance.lua, prepended when loaded).
-- Next-stage keys are built from the queue names stored in the workflow hash; on
-- Redis Cluster every step shares the workflow's hash slot (checked when it starts).
local mode = ARGV[2]
local result = finish_step(ARGV[11], ARGV[12], true)
if result == nil then
    return redis.error_reply("NOT FOUND")
end

local ok = mode == "done" or mode == "complete"
return advance(KEYS[11], ARGV[8], ARGV[9], ok, result, ARGV[10], ARGV[5], ARGV[13])

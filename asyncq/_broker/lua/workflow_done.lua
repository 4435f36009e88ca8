-- include: counters
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
if redis.call("LREM", KEYS[1], 0, ARGV[1]) == 0 then
    return redis.error_reply("NOT FOUND")
end
if redis.call("ZREM", KEYS[2], ARGV[1]) == 0 then
    return redis.error_reply("NOT FOUND")
end
local result = redis.call("HGET", KEYS[3], "result")
if mode == "done" or mode == "revoke" then
    if redis.call("DEL", KEYS[3]) == 0 then
        return redis.error_reply("NOT FOUND")
    end
elseif mode == "complete" then
    redis.call("ZADD", KEYS[6], ARGV[7], ARGV[1])
    redis.call("HSET", KEYS[3], "msg", ARGV[6], "state", "completed")
else
    redis.call("ZADD", KEYS[7], ARGV[5], ARGV[1])
    for _, range in ipairs({
        redis.call("ZRANGE", KEYS[7], "-inf", ARGV[11], "BYSCORE"),
        redis.call("ZRANGE", KEYS[7], 0, -tonumber(ARGV[12])),
    }) do
        for _, id in ipairs(range) do
            if id ~= ARGV[1] then
                redis.call("DEL", KEYS[10] .. id)
                redis.call("ZREM", KEYS[7], id)
            end
        end
    end
    redis.call("HSET", KEYS[3], "msg", ARGV[6], "state", "archived")
    count_day(KEYS[8], ARGV[3])
end
count_day(KEYS[4], ARGV[3])
count_total(KEYS[5], mode == "archive" and KEYS[9] or nil, ARGV[4])

local ok = mode == "done" or mode == "complete"
return advance(KEYS[11], ARGV[8], ARGV[9], ok, result, ARGV[10], ARGV[5], ARGV[13])

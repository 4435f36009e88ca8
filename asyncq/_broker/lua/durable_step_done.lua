-- include: guard, counters, step_ack, handoff, durable_step
-- asyncq durable functions: acknowledge a step task of a run and, in the same script,
-- record its outcome in the run's record and make the run runnable again when it was
-- the last step the run waits for. Used only for tasks carrying the asyncq-durable-run
-- header (asyncq/_broker/durable.py).
-- KEYS[1] active            KEYS[2] lease              KEYS[3] task key
-- KEYS[4] processed:<day>   KEYS[5] processed (all)    KEYS[6] completed
-- KEYS[7] archived          KEYS[8] failed:<day>       KEYS[9] failed (all)
-- KEYS[10] task key prefix of the step's queue          KEYS[11] the run's record
-- KEYS[12] scheduled of the run's queue   KEYS[13] pending of the run's queue
-- KEYS[14] the run task's key
-- ARGV[1] task id    ARGV[2] mode: done | complete | archive | revoke
-- ARGV[3] expiry of the daily counters (unix s)   ARGV[4] max int64   ARGV[5] now (unix s)
-- ARGV[6] msg to store (complete: completed_at set; archive: error set)
-- ARGV[7] completed score (complete)   ARGV[8] the step's index in the run
-- ARGV[9] error message (archive/revoke)   ARGV[10] archive cutoff (unix s)
-- ARGV[11] archive size limit   ARGV[12] now (unix ns, pending_since)
-- ARGV[13] run id   ARGV[14] wake-up channel of the run's queue   ARGV[15] run's queue
-- Returns what happened to the run: "woken", "recorded", "seen" (the step's outcome
-- was recorded already) or "gone" (no record). The run's keys are built by the caller
-- from the step's headers; on Redis Cluster a step shares its run's hash slot only
-- when it runs in the run's queue.
local problem = bad(KEYS[1], "list") or bad(KEYS[2], "zset") or bad(KEYS[3], "hash")
    or bad(KEYS[4], "counter") or bad(KEYS[5], "counter") or bad(KEYS[6], "zset")
    or bad(KEYS[7], "zset") or bad(KEYS[8], "counter") or bad(KEYS[9], "counter")
    or bad(KEYS[11], "hash") or bad(KEYS[12], "zset") or bad(KEYS[13], "list")
    or bad(KEYS[14], "hash")
if problem then
    return redis.error_reply(problem)
end
local mode = ARGV[2]
local result = finish_step(ARGV[10], ARGV[11], false)
if result == nil then
    return redis.error_reply("NOT FOUND")
end

local field = (mode == "done" or mode == "complete") and "r" or "e"
-- a step that wrote no result (a Go handler, a task without retention) returned null
local value = field == "r" and (result or "null") or ARGV[9]
return record_step(KEYS[11], ARGV[8], field, value, {
    id = ARGV[13], scheduled = KEYS[12], pending = KEYS[13], task = KEYS[14],
    channel = ARGV[14], name = ARGV[15], now = ARGV[12],
})

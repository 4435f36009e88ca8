-- include: guard, counters, durable_step
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
if redis.call("LREM", KEYS[1], 0, ARGV[1]) == 0 then
    return redis.error_reply("NOT FOUND")
end
if redis.call("ZREM", KEYS[2], ARGV[1]) == 0 then
    return redis.error_reply("NOT FOUND")
end
local result = redis.call("HGET", KEYS[3], "result")
if mode == "done" or mode == "revoke" then
    redis.call("DEL", KEYS[3])
elseif mode == "complete" then
    redis.call("ZADD", KEYS[6], ARGV[7], ARGV[1])
    redis.call("HSET", KEYS[3], "msg", ARGV[6], "state", "completed")
else
    redis.call("ZADD", KEYS[7], ARGV[5], ARGV[1])
    for _, range in ipairs({
        redis.call("ZRANGE", KEYS[7], "-inf", ARGV[10], "BYSCORE"),
        redis.call("ZRANGE", KEYS[7], 0, -tonumber(ARGV[11])),
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

local field = (mode == "done" or mode == "complete") and "r" or "e"
-- a step that wrote no result (a Go handler, a task without retention) returned null
local value = field == "r" and (result or "null") or ARGV[9]
return record_step(KEYS[11], ARGV[8], field, value, {
    id = ARGV[13], scheduled = KEYS[12], pending = KEYS[13], task = KEYS[14],
    channel = ARGV[14], name = ARGV[15], now = ARGV[12],
})

-- include: guard
-- asyncq durable functions: cancel a run (the Inspector). A run whose task is pending,
-- scheduled (waiting) or retrying is archived at once with a cancellation error, its
-- record marked cancelled and expired as a failed run's, and it leaves the signal
-- wait it sits in. A run whose attempt is active is only marked cancelled here: the
-- caller then stops the attempt (Pub/Sub) and the worker archives it. Recorded entries
-- are never touched; steps already enqueued run and are recorded as usual.
-- KEYS[1] the run's record   KEYS[2] the run task's key   KEYS[3] archived
-- KEYS[4] the waiting-runs set of the signal it waits for (ARGV[6] "" when none)
-- KEYS[5] pending   KEYS[6] scheduled   KEYS[7] retry
-- ARGV[1] run id   ARGV[2] now (unix s)   ARGV[3] the task's msg to archive (error set)
-- ARGV[4] record expiry (s)   ARGV[5] the task state ARGV[3] was read in
-- ARGV[6] member "<run id> <index>" of KEYS[4]   ARGV[7] archive cutoff (unix s)
-- ARGV[8] archive size limit   ARGV[9] task key prefix
-- Returns the run's state before the call (running, waiting, succeeded, failed,
-- cancelled), "gone" (no record) or "moved" (the task's state is no longer ARGV[5]).
local run, tkey = KEYS[1], KEYS[2]
local problem = bad(run, "hash") or bad(tkey, "hash") or bad(KEYS[3], "zset")
    or bad(KEYS[4], "set") or bad(KEYS[5], "list") or bad(KEYS[6], "zset")
    or bad(KEYS[7], "zset")
if problem then
    return redis.error_reply(problem)
end
if redis.call("EXISTS", run) == 0 then
    return "gone"
end
local before = redis.call("HGET", run, "state") or "running"
if before == "succeeded" or before == "failed" or before == "cancelled" then
    return before
end
local tstate = redis.call("HGET", tkey, "state") or ""
if tstate ~= ARGV[5] then
    return "moved"
end
if tstate == "archived" then
    return "failed"
elseif tstate == "completed" then
    return "succeeded"
end
redis.call("HSET", run, "state", "cancelled")
if tstate == "active" then
    -- kept as a failed run's, whether the stop or the attempt's suspension archives it
    redis.call("EXPIRE", run, ARGV[4])
    return before
end
if tstate == "pending" then
    redis.call("LREM", KEYS[5], 0, ARGV[1])
elseif tstate == "scheduled" then
    redis.call("ZREM", KEYS[6], ARGV[1])
elseif tstate == "retry" then
    redis.call("ZREM", KEYS[7], ARGV[1])
end
if tstate ~= "" then
    redis.call("ZADD", KEYS[3], ARGV[2], ARGV[1])
    redis.call("HSET", tkey, "msg", ARGV[3], "state", "archived")
    for _, range in ipairs({
        redis.call("ZRANGE", KEYS[3], "-inf", ARGV[7], "BYSCORE"),
        redis.call("ZRANGE", KEYS[3], 0, -tonumber(ARGV[8])),
    }) do
        for _, id in ipairs(range) do
            if id ~= ARGV[1] then
                redis.call("DEL", ARGV[9] .. id)
                redis.call("ZREM", KEYS[3], id)
            end
        end
    end
end
if ARGV[6] ~= "" then
    redis.call("SREM", KEYS[4], ARGV[6])
end
redis.call("HDEL", run, "until")
redis.call("EXPIRE", run, ARGV[4])
return before

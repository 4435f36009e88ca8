-- include: guard
-- asyncq durable functions: start a run (DurableFunction.start), atomically: enqueue its
-- task as pending, as enqueue.lua does, and write its record with the state "pending",
-- so that the Inspector knows the run before its first attempt and no crash leaves the
-- one without the other. The record expires after ARGV[6] seconds unless an attempt's
-- suspension or settle keeps it (durable_suspend.lua, durable_settle.lua): a task
-- deleted before its first attempt (asynq task delete) leaves a record that the
-- Inspector does not show and Redis drops. Unlike enqueue.lua, the task is never
-- delivered to an idle worker directly: the wake-up below starts a fetch.
-- KEYS[1] task key   KEYS[2] pending   KEYS[3] the run's record
-- KEYS[4] (optional, not on Redis Cluster): asynq:queues
-- ARGV[1] msg (TaskMessage bytes)   ARGV[2] run id (the task id)
-- ARGV[3] now, unix nanoseconds (pending_since)   ARGV[4] wake-up channel
-- ARGV[5] queue name   ARGV[6] the record's expiry (s)
-- Returns 1 when written, 0 when the task or a record of that id exists.
-- The task key and the record need no type check: they are known not to exist.
local problem = bad(KEYS[2], "list") or (KEYS[4] and bad(KEYS[4], "set"))
if problem then
    return redis.error_reply(problem)
end
if redis.call("EXISTS", KEYS[1], KEYS[3]) > 0 then
    return 0
end
redis.call("LPUSH", KEYS[2], ARGV[2])
redis.call("HSET", KEYS[1], "msg", ARGV[1], "state", "pending", "pending_since", ARGV[3])
redis.call("HSET", KEYS[3], "state", "pending")
redis.call("EXPIRE", KEYS[3], ARGV[6])
redis.pcall("PUBLISH", ARGV[4], ARGV[5])
if KEYS[4] then
    redis.call("SADD", KEYS[4], ARGV[5])
end
return 1

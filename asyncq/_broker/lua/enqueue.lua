-- Enqueue a pending task (asynq Enqueue).
-- KEYS[1] task key  asynq:{q}:t:<id>
-- KEYS[2] pending   asynq:{q}:pending
-- ARGV[1] msg (TaskMessage bytes)
-- ARGV[2] task id
-- ARGV[3] now, unix nanoseconds (pending_since)
-- ARGV[4] asyncq: wake-up channel (optional), ARGV[5] message published on it
-- Returns 1 when written, 0 when the task id already exists.
-- asyncq: nothing is written when a destination key holds another type, so a failed
-- call never leaves a task hash without its list entry: the LPUSH goes first (a
-- WRONGTYPE there stops the script before any write), and the HSET after it cannot
-- fail, the task key being known not to exist. A script runs atomically, so no
-- reader sees the id before its hash.
-- The wake-up is an optimisation: redis.pcall, so that a user whose ACL forbids the
-- channel still gets the write (an error here would come after the write).
-- KEYS[3] asyncq (optional, not on Redis Cluster): asynq:queues, and ARGV[6] the queue name:
-- the queue is registered with the write, so a queue removed under a long-lived client
-- (`queue rm`, FLUSHALL) is listed again by its next enqueue.
local registry = KEYS[3]
if registry and not ({none=true, set=true})[redis.call("TYPE", registry).ok] then
    return redis.error_reply("WRONGTYPE " .. registry .. " is not a set")
end
if redis.call("EXISTS", KEYS[1]) == 1 then
    return 0
end
local len = redis.call("LPUSH", KEYS[2], ARGV[2])
redis.call("HSET", KEYS[1], "msg", ARGV[1], "state", "pending", "pending_since", ARGV[3])
if len == 1 and ARGV[4] then
    redis.pcall("PUBLISH", ARGV[4], ARGV[5])
end
if registry then
    redis.call("SADD", registry, ARGV[6])
end
return 1

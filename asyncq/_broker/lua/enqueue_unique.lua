-- include: guard
-- Enqueue a pending task guarded by a uniqueness lock (asynq EnqueueUnique).
-- KEYS[1] unique key  asynq:{q}:unique:<type>:<md5>
-- KEYS[2] task key
-- KEYS[3] pending
-- ARGV[1] task id
-- ARGV[2] lock TTL, whole seconds
-- ARGV[3] msg
-- ARGV[4] now, unix nanoseconds
-- ARGV[5] asyncq: wake-up channel (optional), ARGV[6] message published on it
-- Returns 1 when written, -1 when the lock is held, 0 when the id exists
-- (the lock just taken is kept in that case, as asynq does).
-- The wake-up is an optimisation: redis.pcall, so that a user whose ACL forbids the
-- channel still gets the write (an error here would come after the write).
-- asyncq: nothing is written when a destination key holds another type, so a failed
-- call never leaves a task hash without its list or set entry (nor a lock).
-- KEYS[4] asyncq (optional, not on Redis Cluster): asynq:queues, and ARGV[7] the queue name:
-- the queue is registered with the write, so a queue removed under a long-lived client
-- (`queue rm`, FLUSHALL) is listed again by its next enqueue.
local registry = KEYS[4]
local problem = (registry and bad(registry, "set")) or bad(KEYS[3], "list")
if problem then
    return redis.error_reply(problem)
end
if not redis.call("SET", KEYS[1], ARGV[1], "NX", "EX", ARGV[2]) then
    return -1
end
if redis.call("EXISTS", KEYS[2]) == 1 then
    return 0
end
redis.call("HSET", KEYS[2], "msg", ARGV[3], "state", "pending", "pending_since", ARGV[4],
    "unique_key", KEYS[1])
if redis.call("LPUSH", KEYS[3], ARGV[1]) == 1 and ARGV[5] then
    redis.pcall("PUBLISH", ARGV[5], ARGV[6])
end
if registry then
    redis.call("SADD", registry, ARGV[7])
end
return 1

-- include: guard
-- Write a scheduled task guarded by a uniqueness lock (asynq ScheduleUnique).
-- KEYS[1] unique key
-- KEYS[2] task key
-- KEYS[3] scheduled
-- ARGV[1] task id
-- ARGV[2] lock TTL, whole seconds
-- ARGV[3] process-at, unix seconds
-- ARGV[4] msg
-- Returns 1 when written, -1 when the lock is held, 0 when the id exists.
-- asyncq: nothing is written when a destination key holds another type, so a failed
-- call never leaves a task hash without its list or set entry (nor a lock).
-- KEYS[4] asyncq (optional, not on Redis Cluster): asynq:queues, and ARGV[5] the queue name:
-- the queue is registered with the write, so a queue removed under a long-lived client
-- (`queue rm`, FLUSHALL) is listed again by its next enqueue.
local registry = KEYS[4]
local problem = (registry and bad(registry, "set")) or bad(KEYS[3], "zset")
if problem then
    return redis.error_reply(problem)
end
if not redis.call("SET", KEYS[1], ARGV[1], "NX", "EX", ARGV[2]) then
    return -1
end
if redis.call("EXISTS", KEYS[2]) == 1 then
    return 0
end
redis.call("HSET", KEYS[2], "msg", ARGV[4], "state", "scheduled", "unique_key", KEYS[1])
redis.call("ZADD", KEYS[3], ARGV[3], ARGV[1])
if registry then
    redis.call("SADD", registry, ARGV[5])
end
return 1

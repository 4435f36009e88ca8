-- include: guard
-- Add an aggregating task guarded by a uniqueness lock (asynq AddToGroupUnique).
-- KEYS[1] task key
-- KEYS[2] group
-- KEYS[3] groups
-- KEYS[4] unique key
-- ARGV[1] msg
-- ARGV[2] task id
-- ARGV[3] now, unix seconds
-- ARGV[4] group name
-- ARGV[5] lock TTL, whole seconds
-- Returns 1 when written, -1 when the lock is held, 0 when the id exists.
-- Like asynq, no unique_key hash field is written on this path.
-- asyncq: nothing is written when a destination key holds another type, so a failed
-- call never leaves a task hash without its list or set entry (nor a lock).
-- KEYS[5] asyncq (optional, not on Redis Cluster): asynq:queues, and ARGV[6] the queue name:
-- the queue is registered with the write, so a queue removed under a long-lived client
-- (`queue rm`, FLUSHALL) is listed again by its next enqueue.
local registry = KEYS[5]
local problem = (registry and bad(registry, "set")) or bad(KEYS[2], "zset") or bad(KEYS[3], "set")
if problem then
    return redis.error_reply(problem)
end
if not redis.call("SET", KEYS[4], ARGV[2], "NX", "EX", ARGV[5]) then
    return -1
end
if redis.call("EXISTS", KEYS[1]) == 1 then
    return 0
end
redis.call("HSET", KEYS[1], "msg", ARGV[1], "state", "aggregating", "group", ARGV[4])
redis.call("ZADD", KEYS[2], ARGV[3], ARGV[2])
redis.call("SADD", KEYS[3], ARGV[4])
if registry then
    redis.call("SADD", registry, ARGV[6])
end
return 1

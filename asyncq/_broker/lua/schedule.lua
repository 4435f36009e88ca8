-- include: guard
-- Write a scheduled task (asynq Schedule).
-- KEYS[1] task key
-- KEYS[2] scheduled
-- ARGV[1] msg
-- ARGV[2] process-at, unix seconds
-- ARGV[3] task id
-- Returns 1 when written, 0 when the task id already exists.
-- asyncq: nothing is written when a destination key holds another type, so a failed
-- call never leaves a task hash without its list or set entry (nor a lock).
-- KEYS[3] asyncq (optional, not on Redis Cluster): asynq:queues, and ARGV[4] the queue name:
-- the queue is registered with the write, so a queue removed under a long-lived client
-- (`queue rm`, FLUSHALL) is listed again by its next enqueue.
local registry = KEYS[3]
local problem = (registry and bad(registry, "set")) or bad(KEYS[2], "zset")
if problem then
    return redis.error_reply(problem)
end
if redis.call("EXISTS", KEYS[1]) == 1 then
    return 0
end
redis.call("HSET", KEYS[1], "msg", ARGV[1], "state", "scheduled")
redis.call("ZADD", KEYS[2], ARGV[2], ARGV[3])
if registry then
    redis.call("SADD", registry, ARGV[4])
end
return 1

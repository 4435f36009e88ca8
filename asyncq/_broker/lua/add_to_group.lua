-- include: guard
-- Add an aggregating task to a group (asynq AddToGroup).
-- KEYS[1] task key
-- KEYS[2] group     asynq:{q}:g:<group>
-- KEYS[3] groups    asynq:{q}:groups
-- ARGV[1] msg
-- ARGV[2] task id
-- ARGV[3] now, unix seconds
-- ARGV[4] group name
-- Returns 1 when written, 0 when the task id already exists.
-- asyncq: nothing is written when a destination key holds another type, so a failed
-- call never leaves a task hash without its list or set entry (nor a lock).
-- KEYS[4] asyncq (optional, not on Redis Cluster): asynq:queues, and ARGV[5] the queue name:
-- the queue is registered with the write, so a queue removed under a long-lived client
-- (`queue rm`, FLUSHALL) is listed again by its next enqueue.
local registry = KEYS[4]
local problem = (registry and bad(registry, "set")) or bad(KEYS[2], "zset") or bad(KEYS[3], "set")
if problem then
    return redis.error_reply(problem)
end
if redis.call("EXISTS", KEYS[1]) == 1 then
    return 0
end
redis.call("HSET", KEYS[1], "msg", ARGV[1], "state", "aggregating", "group", ARGV[4])
redis.call("ZADD", KEYS[2], ARGV[3], ARGV[2])
redis.call("SADD", KEYS[3], ARGV[4])
if registry then
    redis.call("SADD", registry, ARGV[5])
end
return 1

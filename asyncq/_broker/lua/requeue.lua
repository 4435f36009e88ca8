-- include: guard
-- Put an active task back at the front of pending (asynq Requeue, on shutdown).
-- KEYS[1] active
-- KEYS[2] lease
-- KEYS[3] pending
-- KEYS[4] task key
-- ARGV[1] task id
-- ARGV[2] asyncq: wake-up channel (optional), ARGV[3] message published on it
-- RPUSH puts it at the tail, which is where workers take from next.
-- The wake-up is an optimisation: redis.pcall, so that a user whose ACL forbids the
-- channel still gets the write (an error here would come after the write).
-- asyncq: every key written below is checked before the first write (a key of
-- another type, a counter that is not an integer), so a failed call changes nothing.
local problem = bad(KEYS[2], "zset") or bad(KEYS[3], "list") or bad(KEYS[4], "hash")
if problem then
    return redis.error_reply(problem)
end
if redis.call("LREM", KEYS[1], 0, ARGV[1]) == 0 then
    return redis.error_reply("NOT FOUND")
end
if redis.call("ZREM", KEYS[2], ARGV[1]) == 0 then
    return redis.error_reply("NOT FOUND")
end
local n = redis.call("RPUSH", KEYS[3], ARGV[1])
redis.call("HSET", KEYS[4], "state", "pending")
if n == 1 and ARGV[2] then
    redis.pcall("PUBLISH", ARGV[2], ARGV[3])
end
return redis.status_reply("OK")

-- Write a scheduled task guarded by a uniqueness lock (asynq ScheduleUnique).
-- KEYS[1] unique key
-- KEYS[2] task key
-- KEYS[3] scheduled
-- ARGV[1] task id
-- ARGV[2] lock TTL, whole seconds
-- ARGV[3] process-at, unix seconds
-- ARGV[4] msg
-- Returns 1 when written, -1 when the lock is held, 0 when the id exists.
if not redis.call("SET", KEYS[1], ARGV[1], "NX", "EX", ARGV[2]) then
    return -1
end
if redis.call("EXISTS", KEYS[2]) == 1 then
    return 0
end
redis.call("HSET", KEYS[2], "msg", ARGV[4], "state", "scheduled", "unique_key", KEYS[1])
redis.call("ZADD", KEYS[3], ARGV[3], ARGV[1])
return 1

-- include: guard, counters
-- Finish a task kept for its retention (asynq MarkAsComplete).
-- KEYS[1] active
-- KEYS[2] lease
-- KEYS[3] completed
-- KEYS[4] task key
-- KEYS[5] processed:<YYYY-MM-DD>
-- KEYS[6] processed (all-time)
-- KEYS[7] unique key (only passed when the message has one)
-- ARGV[1] task id
-- ARGV[2] expiry of the daily counter, unix seconds
-- ARGV[3] completed score: now + retention, unix seconds
-- ARGV[4] msg with completed_at set
-- ARGV[5] max int64
-- asyncq: every key written below is checked before the first write (a key of
-- another type, a counter that is not an integer), so a failed call changes nothing.
local problem = bad(KEYS[2], "zset") or bad(KEYS[3], "zset") or bad(KEYS[4], "hash")
    or bad(KEYS[5], "counter") or bad(KEYS[6], "counter") or (KEYS[7] and bad(KEYS[7], "string"))
if problem then
    return redis.error_reply(problem)
end
if redis.call("LREM", KEYS[1], 0, ARGV[1]) == 0 then
    return redis.error_reply("NOT FOUND")
end
if redis.call("ZREM", KEYS[2], ARGV[1]) == 0 then
    return redis.error_reply("NOT FOUND")
end
if redis.call("ZADD", KEYS[3], ARGV[3], ARGV[1]) ~= 1 then
    return redis.error_reply("INTERNAL")
end
redis.call("HSET", KEYS[4], "msg", ARGV[4], "state", "completed")
count_day(KEYS[5], ARGV[2])
count_total(KEYS[6], nil, ARGV[5])
if KEYS[7] and redis.call("GET", KEYS[7]) == ARGV[1] then
    redis.call("DEL", KEYS[7])
end
return redis.status_reply("OK")

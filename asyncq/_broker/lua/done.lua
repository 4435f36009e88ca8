-- include: guard, counters
-- Finish a task that keeps no retention (asynq Done; also RevokeTask).
-- KEYS[1] active
-- KEYS[2] lease
-- KEYS[3] task key
-- KEYS[4] processed:<YYYY-MM-DD>
-- KEYS[5] processed (all-time)
-- KEYS[6] unique key (only passed when the message has one)
-- ARGV[1] task id
-- ARGV[2] expiry of the daily counter, unix seconds (now + 90 days)
-- ARGV[3] max int64, where the all-time counter wraps to 1
-- asyncq: every key written below is checked before the first write (a key of
-- another type, a counter that is not an integer), so a failed call changes nothing.
local problem = bad(KEYS[2], "zset") or bad(KEYS[4], "counter") or bad(KEYS[5], "counter")
    or (KEYS[6] and bad(KEYS[6], "string"))
if problem then
    return redis.error_reply(problem)
end
if redis.call("LREM", KEYS[1], 0, ARGV[1]) == 0 then
    return redis.error_reply("NOT FOUND")
end
if redis.call("ZREM", KEYS[2], ARGV[1]) == 0 then
    return redis.error_reply("NOT FOUND")
end
if redis.call("DEL", KEYS[3]) == 0 then
    return redis.error_reply("NOT FOUND")
end
count_day(KEYS[4], ARGV[2])
count_total(KEYS[5], nil, ARGV[3])
if KEYS[6] and redis.call("GET", KEYS[6]) == ARGV[1] then
    redis.call("DEL", KEYS[6])
end
return redis.status_reply("OK")

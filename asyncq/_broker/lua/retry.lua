-- include: guard, counters
-- Move an active task to the retry set (asynq Retry).
-- KEYS[1] task key
-- KEYS[2] active
-- KEYS[3] lease
-- KEYS[4] retry
-- KEYS[5] processed:<YYYY-MM-DD>
-- KEYS[6] failed:<YYYY-MM-DD>
-- KEYS[7] processed (all-time)
-- KEYS[8] failed (all-time)
-- ARGV[1] task id
-- ARGV[2] msg with retried/error_msg/last_failed_at updated
-- ARGV[3] retry-at, unix seconds
-- ARGV[4] expiry of the daily counters, unix seconds
-- ARGV[5] "1" when the failure counts (is_failure), else "0"
-- ARGV[6] max int64
-- ARGV[7] (optional, the recoverer's) the cutoff, unix seconds: the task is taken
--         only while its lease still ends at or before it. Another worker's recoverer
--         may have retried it meanwhile and a worker taken it again with a fresh lease;
--         that run must not be taken from it (two recoverers wake at the same expiry).
-- asyncq: every key written below is checked before the first write (a key of
-- another type, a counter that is not an integer), so a failed call changes nothing.
local problem = bad(KEYS[3], "zset") or bad(KEYS[4], "zset") or bad(KEYS[1], "hash")
if not problem and tonumber(ARGV[5]) == 1 then
    problem = bad(KEYS[5], "counter") or bad(KEYS[6], "counter") or bad(KEYS[7], "counter")
        or bad(KEYS[8], "counter")
end
if problem then
    return redis.error_reply(problem)
end
if ARGV[7] then
    local lease = redis.call("ZSCORE", KEYS[3], ARGV[1])
    if not lease or tonumber(lease) > tonumber(ARGV[7]) then
        return redis.error_reply("NOT FOUND")
    end
end
if redis.call("LREM", KEYS[2], 0, ARGV[1]) == 0 then
    return redis.error_reply("NOT FOUND")
end
if redis.call("ZREM", KEYS[3], ARGV[1]) == 0 then
    return redis.error_reply("NOT FOUND")
end
redis.call("ZADD", KEYS[4], ARGV[3], ARGV[1])
redis.call("HSET", KEYS[1], "msg", ARGV[2], "state", "retry")
if tonumber(ARGV[5]) == 1 then
    count_day(KEYS[5], ARGV[4])
    count_day(KEYS[6], ARGV[4])
    count_total(KEYS[7], KEYS[8], ARGV[6])
end
return redis.status_reply("OK")

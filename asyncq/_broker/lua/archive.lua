-- include: guard, counters
-- Move an active task to the archive (asynq Archive), trimming old archived tasks.
-- KEYS[1] task key
-- KEYS[2] active
-- KEYS[3] lease
-- KEYS[4] archived
-- KEYS[5] processed:<YYYY-MM-DD>
-- KEYS[6] failed:<YYYY-MM-DD>
-- KEYS[7] processed (all-time)
-- KEYS[8] failed (all-time)
-- KEYS[9] task key prefix  asynq:{q}:t:  (a key, as in asynq)
-- ARGV[1] task id
-- ARGV[2] msg with error_msg/last_failed_at updated
-- ARGV[3] now, unix seconds
-- ARGV[4] cutoff: now - 90 days, unix seconds
-- ARGV[5] archive size limit (10000)
-- ARGV[6] expiry of the daily counters, unix seconds
-- ARGV[7] max int64
-- ARGV[8] (optional, the recoverer's) the cutoff, unix seconds: the task is taken
--         only while its lease still ends at or before it. Another worker's recoverer
--         may have retried it meanwhile and a worker taken it again with a fresh lease;
--         that run must not be taken from it (two recoverers wake at the same expiry).
-- Trimmed tasks lose their hash too, so no hash outlives its archive entry.
-- The task being archived is never trimmed (asynq could trim it when more
-- than 10,000 tasks share its archive second, leaving its hash unindexed).
-- asyncq: every key written below is checked before the first write (a key of
-- another type, a counter that is not an integer), so a failed call changes nothing.
local problem = bad(KEYS[3], "zset") or bad(KEYS[4], "zset") or bad(KEYS[1], "hash")
    or bad(KEYS[5], "counter") or bad(KEYS[6], "counter") or bad(KEYS[7], "counter")
    or bad(KEYS[8], "counter")
if problem then
    return redis.error_reply(problem)
end
if ARGV[8] then
    local lease = redis.call("ZSCORE", KEYS[3], ARGV[1])
    if not lease or tonumber(lease) > tonumber(ARGV[8]) then
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
local old = redis.call("ZRANGE", KEYS[4], "-inf", ARGV[4], "BYSCORE")
for _, id in ipairs(old) do
    if id ~= ARGV[1] then
        redis.call("DEL", KEYS[9] .. id)
        redis.call("ZREM", KEYS[4], id)
    end
end
local excess = redis.call("ZRANGE", KEYS[4], 0, -tonumber(ARGV[5]))
for _, id in ipairs(excess) do
    if id ~= ARGV[1] then
        redis.call("DEL", KEYS[9] .. id)
        redis.call("ZREM", KEYS[4], id)
    end
end
redis.call("HSET", KEYS[1], "msg", ARGV[2], "state", "archived")
count_day(KEYS[5], ARGV[6])
count_day(KEYS[6], ARGV[6])
count_total(KEYS[7], KEYS[8], ARGV[7])
return redis.status_reply("OK")

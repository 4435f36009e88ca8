-- include: guard, counters
-- asyncq: archive a task whose msg cannot be decoded, keeping its bytes as they are.
-- Same transition as archive.lua (and the same trimming), but the protobuf is
-- not rewritten -- it cannot be -- and the reason goes into the hash field
-- asyncq_error instead of error_msg.
-- KEYS[1] task key
-- KEYS[2] archived
-- KEYS[3] source: the active list, or a group / aggregation-set zset
-- KEYS[4] lease (only when KEYS[3] is the active list)
-- KEYS[5] processed:<YYYY-MM-DD>, KEYS[6] failed:<YYYY-MM-DD>,
-- KEYS[7] processed, KEYS[8] failed (only with KEYS[4]; counted as in archive.lua)
-- ARGV[1] task id
-- ARGV[2] now, unix seconds
-- ARGV[3] cutoff: now - 90 days, unix seconds
-- ARGV[4] archive size limit (10000)
-- ARGV[5] task key prefix
-- ARGV[6] error text
-- ARGV[7] expiry of the daily counters, unix seconds
-- ARGV[8] max int64
-- asyncq: every key written below is checked before the first write (a key of
-- another type, a counter that is not an integer), so a failed call changes nothing.
local problem = bad(KEYS[2], "zset") or bad(KEYS[1], "hash")
if not problem and KEYS[4] then
    problem = bad(KEYS[4], "zset") or bad(KEYS[5], "counter") or bad(KEYS[6], "counter")
        or bad(KEYS[7], "counter") or bad(KEYS[8], "counter")
end
if problem then
    return redis.error_reply(problem)
end
if KEYS[4] then
    if redis.call("LREM", KEYS[3], 0, ARGV[1]) == 0 then
        return redis.error_reply("NOT FOUND")
    end
    redis.call("ZREM", KEYS[4], ARGV[1])
elseif redis.call("ZREM", KEYS[3], ARGV[1]) == 0 then
    return redis.error_reply("NOT FOUND")
end
redis.call("ZADD", KEYS[2], ARGV[2], ARGV[1])
local old = redis.call("ZRANGE", KEYS[2], "-inf", ARGV[3], "BYSCORE")
for _, id in ipairs(old) do
    if id ~= ARGV[1] then
        redis.call("DEL", ARGV[5] .. id)
        redis.call("ZREM", KEYS[2], id)
    end
end
local excess = redis.call("ZRANGE", KEYS[2], 0, -tonumber(ARGV[4]))
for _, id in ipairs(excess) do
    if id ~= ARGV[1] then
        redis.call("DEL", ARGV[5] .. id)
        redis.call("ZREM", KEYS[2], id)
    end
end
redis.call("HSET", KEYS[1], "state", "archived", "asyncq_error", ARGV[6])
if KEYS[4] then
    count_day(KEYS[5], ARGV[7])
    count_day(KEYS[6], ARGV[7])
    count_total(KEYS[7], KEYS[8], ARGV[8])
end
return redis.status_reply("OK")

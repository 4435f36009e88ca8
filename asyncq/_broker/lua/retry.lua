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
if redis.call("LREM", KEYS[2], 0, ARGV[1]) == 0 then
    return redis.error_reply("NOT FOUND")
end
if redis.call("ZREM", KEYS[3], ARGV[1]) == 0 then
    return redis.error_reply("NOT FOUND")
end
redis.call("ZADD", KEYS[4], ARGV[3], ARGV[1])
redis.call("HSET", KEYS[1], "msg", ARGV[2], "state", "retry")
if tonumber(ARGV[5]) == 1 then
    if redis.call("INCR", KEYS[5]) == 1 then
        redis.call("EXPIREAT", KEYS[5], ARGV[4])
    end
    if redis.call("INCR", KEYS[6]) == 1 then
        redis.call("EXPIREAT", KEYS[6], ARGV[4])
    end
    if redis.call("GET", KEYS[7]) == ARGV[6] then
        redis.call("SET", KEYS[7], 1)
        redis.call("SET", KEYS[8], 1)
    else
        redis.call("INCR", KEYS[7])
        redis.call("INCR", KEYS[8])
    end
end
return redis.status_reply("OK")

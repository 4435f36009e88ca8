-- _lib/counters.lua: asynq's processed/failed counters, as its scripts write them.
-- count_day(key, expire_at): a daily counter (processed:<date>, failed:<date>), given
-- its expiry (unix seconds) when this INCR created it.
local function count_day(key, expire_at)
    if redis.call("INCR", key) == 1 then
        redis.call("EXPIREAT", key, expire_at)
    end
end
-- count_total(processed, failed, max): the all-time counters. processed wraps to 1
-- when it holds max (max int64, as a string); failed (nil: not counted) follows it,
-- wrapping with it, as asynq does.
local function count_total(processed, failed, max)
    if redis.call("GET", processed) == max then
        redis.call("SET", processed, 1)
        if failed then
            redis.call("SET", failed, 1)
        end
    else
        redis.call("INCR", processed)
        if failed then
            redis.call("INCR", failed)
        end
    end
end

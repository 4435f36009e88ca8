-- asyncq per-task-type rate limit: take one token of a GCRA bucket, or reserve one
-- that becomes available within a short wait.
-- KEYS[1] the type's bucket, asyncq:typerate:{<type>} (a hash: tat, interval, burst)
-- ARGV[1] interval between two tokens, microseconds
-- ARGV[2] burst: tokens the bucket holds
-- ARGV[3] the longest wait to reserve, microseconds
-- Time is Redis TIME (worker clocks do not matter; scripts replicate by effects).
-- GCRA: tat is the theoretical arrival time; a token may be used from
-- tat + interval - burst * interval on. When that is at most ARGV[3] away the token
-- is taken now for that moment (tat moves on by one interval) and the wait is
-- returned with 1; otherwise nothing is written and the wait is returned with 0.
-- Returns {granted (1/0), wait in microseconds}.
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local iv = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local tat = math.max(tonumber(redis.call("HGET", KEYS[1], "tat") or "0") or 0, now)
local wait = math.max(0, tat + iv - burst * iv - now)
if wait > tonumber(ARGV[3]) then
    return {0, wait}
end
local new = tat + iv
redis.call("HSET", KEYS[1], "tat", string.format("%.0f", new), "interval", iv, "burst", burst)
-- Kept an hour past a full bucket, like the queue buckets.
redis.call("PEXPIRE", KEYS[1], math.ceil((new - now) / 1000) + 3600000)
return {1, wait}

-- asyncq per-task-type rate limit: take up to ARGV[4] tokens of a GCRA bucket,
-- each available now or within a short wait.
-- KEYS[1] the type's bucket, asyncq:typerate:{<type>} (a hash: tat, interval, burst,
--         limited: tokens refused so far, what the Inspector shows as held back)
-- ARGV[1] interval between two tokens, microseconds
-- ARGV[2] burst: tokens the bucket holds
-- ARGV[3] the longest wait to reserve, microseconds
-- ARGV[4] tokens wanted (the tasks of the type one fetch took)
-- Time is Redis TIME (worker clocks do not matter; scripts replicate by effects).
-- GCRA: tat is the theoretical arrival time; the next token may be used from
-- tat + interval - burst * interval on. Each token whose moment is at most ARGV[3]
-- away is taken for that moment (tat moves on by one interval); the first that is
-- further away stops the call.
-- Returns {n, wait_1, ..., wait_n, next}: n tokens taken, the wait (microseconds
-- from now) of each, and, when n < ARGV[4], the wait until the next token.
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local iv = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local max_wait = tonumber(ARGV[3])
local want = tonumber(ARGV[4])
local tat = math.max(tonumber(redis.call("HGET", KEYS[1], "tat") or "0") or 0, now)
local out = {0}
local n = 0
while n < want do
    local wait = math.max(0, tat + iv - burst * iv - now)
    if wait > max_wait then
        out[#out + 1] = wait
        break
    end
    tat = tat + iv
    n = n + 1
    out[#out + 1] = wait
end
out[1] = n
if n > 0 then
    -- The client's text, not the numbers: Redis 7.2 would store 900000000 as "9e+8".
    redis.call("HSET", KEYS[1], "tat", string.format("%.0f", tat), "interval", ARGV[1],
        "burst", ARGV[2])
    -- Kept an hour past a full bucket, like the queue buckets.
    redis.call("PEXPIRE", KEYS[1], math.ceil((tat - now) / 1000) + 3600000)
end
if n < want then
    -- The refused tasks go back to the retry set: counted here, in the call that
    -- refuses them, so seeing how many a rate holds back costs no extra command.
    -- n = 0 happens only when the stored tat is ahead of now, so the bucket exists
    -- and keeps the expiry its last taker set (tat is unchanged).
    redis.call("HINCRBY", KEYS[1], "limited", want - n)
end
return out

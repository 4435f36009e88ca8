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
-- from now) of each, and, when n < ARGV[4], the wait until the next token; then, when
-- the stored bucket held a value no worker writes, that value ("tat=..." as a string).
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local iv = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local max_wait = tonumber(ARGV[3])
local want = tonumber(ARGV[4])
-- A bucket of another type is refused by name (the worker logs it and retries the task).
local kind = redis.call("TYPE", KEYS[1]).ok
if kind ~= "none" and kind ~= "hash" then
    return redis.error_reply("WRONGTYPE " .. KEYS[1] .. " is not a hash")
end
-- A stored tat no worker writes (not a number, nan, inf, or further ahead than a token
-- can be reserved under this rate or the stored one) would refuse every task of the
-- type for good, or fail the PEXPIRE below: the bucket starts full again instead, and
-- the value is returned (last element) for the worker to name in a warning.
local stored = redis.call("HGET", KEYS[1], "tat")
local bad = false
local tat = tonumber(stored or "0")
local function sane(v)
    return v and v == v and v >= 0 and v < 2 ^ 62
end
if stored then
    local ahead = burst * iv
    local siv, sburst = tonumber(redis.call("HGET", KEYS[1], "interval") or ""),
        tonumber(redis.call("HGET", KEYS[1], "burst") or "")
    if sane(siv) and sane(sburst) and siv * sburst > ahead then
        ahead = siv * sburst
    end
    if not sane(tat) or tat > now + ahead + max_wait then
        bad, tat = "tat=" .. string.sub(stored, 1, 40), now
    end
end
tat = math.max(tat or 0, now)
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
    local counted = redis.pcall("HINCRBY", KEYS[1], "limited", want - n)
    if type(counted) == "table" then -- a count no worker wrote: it starts again
        local old = redis.call("HGET", KEYS[1], "limited")
        redis.call("HSET", KEYS[1], "limited", want - n)
        bad = bad or "limited=" .. string.sub(old, 1, 40)
    end
end
if bad then
    out[#out + 1] = bad
end
return out

-- include: guard
-- asyncq durable functions: record the result of one wait of a run unless something
-- recorded it first, and return the result that stands. A wait_for that timed out
-- records its None ("") here, racing a signal that may record its payload
-- (durable_signal.lua): whichever runs first is the wait's result, for good.
-- KEYS[1] the run's record   KEYS[2] the signal's waiting-runs set
-- ARGV[1] the step index   ARGV[2] the value   ARGV[3] the member "<run id> <index>"
local problem = bad(KEYS[1], "hash") or bad(KEYS[2], "set")
if problem then
    return redis.error_reply(problem)
end
local field = "r:" .. ARGV[1]
local got = redis.call("HGET", KEYS[1], field)
if got then
    return got
end
redis.call("HSET", KEYS[1], field, ARGV[2])
redis.call("SREM", KEYS[2], ARGV[3])
return ARGV[2]

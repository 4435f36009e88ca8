-- A scheduler claims one cron tick (asyncq-only; Scheduler._claim).
-- KEYS[1] the tick's claim: asyncq:scheduler_claims:{<identity>}:<tick>, a STRING holding
--         "<scheduler id>/<entry id>" while a scheduler enqueues the tick, with a PX of
--         its claim lease, then "done:<scheduler id>:<task id>" once it is enqueued
-- ARGV[1] the caller's claim value  ARGV[2] the claim lease, milliseconds
-- Returns {outcome, what the key held, its PTTL}:
--   "claimed"  the tick is the caller's (a new claim, or its own whose reply was lost)
--   "done"     a scheduler has finished the tick
--   "held"     another scheduler is enqueueing it, for PTTL more milliseconds at most
--   "replaced" the key held what no scheduler writes (another type, a value with no
--              expiry, done or not, a value not shaped "<id>/<entry id>"), which would
--              have held the tick past its misfire grace: the tick is the caller's now
--              (the tick's derived task ID still stops a second enqueue)
local t = redis.call("TYPE", KEYS[1]).ok
if t == "none" then
    redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2])
    return {"claimed", "", 0}
end
if t ~= "string" then -- SET takes a key of any type
    redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2])
    return {"replaced", "a " .. t, 0}
end
local held = redis.call("GET", KEYS[1])
if held == ARGV[1] then
    return {"claimed", held, 0}
end
local pttl = redis.call("PTTL", KEYS[1]) -- -1: no expiry (the key exists)
local done = string.match(held, "^done:") ~= nil
if pttl == -1 or not (done or string.match(held, "^.+/.+$")) then
    redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2])
    return {"replaced", held, 0}
end
if done then
    return {"done", held, pttl}
end
return {"held", held, pttl}

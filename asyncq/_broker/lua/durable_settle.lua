-- include: guard
-- asyncq durable functions: write what an attempt of a run decided when it ends
-- without suspending (it returned, or raised): the values it recorded (unless already
-- there), the run's state, and the record's expiry once the run has ended. A run that
-- goes on (its attempt raised and it is retried) keeps its record for good: the expiry
-- a record has until its first attempt (durable_start.lua) is removed. A cancelled
-- run's state is kept (its next attempt ends at once, archived: DurableFunction.serve).
-- KEYS[1] the run's record
-- ARGV[1] state   ARGV[2] expiry (seconds; 0: none)   ARGV[3] F, then F field/value pairs
local problem = bad(KEYS[1], "hash")
if problem then
    return redis.error_reply(problem)
end
for a = 4, 3 + 2 * tonumber(ARGV[3]), 2 do
    redis.call("HSETNX", KEYS[1], ARGV[a], ARGV[a + 1])
end
-- a run cancelled while the attempt ran stays cancelled, whatever the attempt made of it
if redis.call("HGET", KEYS[1], "state") ~= "cancelled" then
    redis.call("HSET", KEYS[1], "state", ARGV[1])
end
if tonumber(ARGV[2]) > 0 then
    redis.call("EXPIRE", KEYS[1], ARGV[2])
else
    redis.call("PERSIST", KEYS[1])
end
return 1

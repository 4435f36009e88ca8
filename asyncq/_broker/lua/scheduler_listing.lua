-- A scheduler sharing an entry takes or renews the lease on listing it (asyncq-only;
-- Scheduler(shared=True)).
-- KEYS[1] asyncq:scheduler_lister:{<identity>}, a STRING holding the lister's scheduler
--         ID with a PX of two heartbeats
-- ARGV[1] the caller's scheduler ID  ARGV[2] the lease, milliseconds
-- ARGV[3] "take" (take or renew) or "release" (hand it back if the caller holds it)
-- Returns, for "release", 1 when the caller handed the lease back, else 0; for "take",
-- {1 when the caller holds the lease now, else 0; 1 when the key held what no scheduler
-- writes and was replaced (another type, or a value with no expiry, which would have
-- hidden the entry from every listing for good), else 0; what it held then}
local t = redis.call("TYPE", KEYS[1]).ok
if ARGV[3] == "release" then
    if t == "string" and redis.call("GET", KEYS[1]) == ARGV[1] then
        redis.call("DEL", KEYS[1])
        return 1
    end
    return 0
end
local found = nil
if t == "string" then
    local held = redis.call("GET", KEYS[1])
    if held ~= ARGV[1] then
        if redis.call("PTTL", KEYS[1]) ~= -1 then -- -1: no expiry (the key exists)
            return {0, 0, ""} -- another scheduler lists it
        end
        found = held
    end
elseif t ~= "none" then -- SET below takes a key of any type
    found = "a " .. t
end
redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2])
if found == nil then
    return {1, 0, ""}
end
return {1, 1, found}

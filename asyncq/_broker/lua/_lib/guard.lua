-- _lib/guard.lua: bad(key, kind), the key-type check a script runs on every key it
-- writes before its first write, so that a call failing on a key of another type
-- changes nothing. kind is a Redis type ("hash", "list", "zset", "set", "string")
-- or "counter": a string holding an integer (INCR would fail on anything else).
-- Returns the error to reply with, or nil when the key is missing or of that kind.
-- typed(key, kind) is the same check, and whether the key exists (for a caller that
-- would ask EXISTS next): the error or nil, then true when the key is there.
local function typed(key, kind)
    local t = redis.call("TYPE", key).ok
    if t == "none" then
        return nil, false
    end
    if kind == "counter" then
        if t ~= "string" then
            return "WRONGTYPE " .. key .. " is not an integer counter", true
        end
        if not string.match(redis.call("GET", key), "^%-?%d+$") then
            return "ERR " .. key .. " is not an integer counter", true
        end
        return nil, true
    end
    if t ~= kind then
        return "WRONGTYPE " .. key .. " is not a " .. kind, true
    end
    return nil, true
end
local function bad(key, kind)
    return (typed(key, kind))
end

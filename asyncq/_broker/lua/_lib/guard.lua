-- _lib/guard.lua: bad(key, kind), the key-type check a script runs on every key it
-- writes before its first write, so that a call failing on a key of another type
-- changes nothing. kind is a Redis type ("hash", "list", "zset", "set", "string")
-- or "counter": a string holding an integer (INCR would fail on anything else).
-- Returns the error to reply with, or nil when the key is missing or of that kind.
local function bad(key, kind)
    local t = redis.call("TYPE", key).ok
    if t == "none" then
        return nil
    end
    if kind == "counter" then
        if t ~= "string" then
            return "WRONGTYPE " .. key .. " is not an integer counter"
        end
        if not string.match(redis.call("GET", key), "^%-?%d+$") then
            return "ERR " .. key .. " is not an integer counter"
        end
        return nil
    end
    if t ~= kind then
        return "WRONGTYPE " .. key .. " is not a " .. kind
    end
    return nil
end

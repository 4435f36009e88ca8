-- Inspector: one queue's current statistics (asynq CurrentStats).
-- KEYS[1] pending      KEYS[2] active       KEYS[3] scheduled   KEYS[4] retry
-- KEYS[5] archived     KEYS[6] completed    KEYS[7] processed:<today>
-- KEYS[8] failed:<today>  KEYS[9] processed (total)  KEYS[10] failed (total)
-- KEYS[11] paused      KEYS[12] groups
-- ARGV[1] task key prefix   ARGV[2] group key prefix
-- Returns a flat list of (name, value) pairs. Counters are returned as strings so
-- that values near 2^63 keep their precision (Lua numbers are doubles).
local res = {}
local function put(name, value)
    table.insert(res, name)
    table.insert(res, value)
end
put("pending", redis.call("LLEN", KEYS[1]))
put("active", redis.call("LLEN", KEYS[2]))
put("scheduled", redis.call("ZCARD", KEYS[3]))
put("retry", redis.call("ZCARD", KEYS[4]))
put("archived", redis.call("ZCARD", KEYS[5]))
put("completed", redis.call("ZCARD", KEYS[6]))
local counters = {"processed", "failed", "processed_total", "failed_total"}
for i, name in ipairs(counters) do
    put(name, redis.call("GET", KEYS[6 + i]) or "0")
end
put("paused", redis.call("EXISTS", KEYS[11]))
local oldest = "0"
local ids = redis.call("LRANGE", KEYS[1], -1, -1)
if #ids > 0 then
    oldest = redis.call("HGET", ARGV[1] .. ids[1], "pending_since") or "0"
end
put("oldest_pending_since", oldest)
local groups = redis.call("SMEMBERS", KEYS[12])
put("group_size", #groups)
local aggregating = 0
for _, gname in ipairs(groups) do
    aggregating = aggregating + redis.call("ZCARD", ARGV[2] .. gname)
end
put("aggregating_count", aggregating)
return res

-- Messages of a staged aggregation set, oldest first (asynq ReadAggregationSet).
-- KEYS[1] aggregation set
-- KEYS[2] asyncq: aggregation_sets (optional: then the set's deadline is appended)
-- ARGV[1] task key prefix
-- Returns a flat array id1, msg1, ... (asyncq adds the ids so an undecodable
-- member can be archived by id), followed by the deadline when KEYS[2] is given.
-- Members without a hash are skipped.
local out = {}
for _, id in ipairs(redis.call("ZRANGE", KEYS[1], 0, -1)) do
    local msg = redis.call("HGET", ARGV[1] .. id, "msg")
    if msg then
        out[#out + 1] = id
        out[#out + 1] = msg
    end
end
if KEYS[2] then
    out[#out + 1] = redis.call("ZSCORE", KEYS[2], KEYS[1])
end
return out

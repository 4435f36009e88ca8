-- Put members of sets past their deadline back into their group
-- (asynq ReclaimStaleAggregationSets).
-- KEYS[1] aggregation_sets
-- KEYS[2] asyncq: groups (optional; see below)
-- ARGV[1] now, unix seconds
-- ARGV[2] asyncq: group key prefix asynq:{q}:g: (with KEYS[2])
-- The group key is the set key without its last ":<set id>" segment. asyncq
-- also re-adds the group name to KEYS[2], so the aggregator checks the group
-- again (asynq leaves it out until another task joins the group).
local stale = redis.call("ZRANGEBYSCORE", KEYS[1], "-inf", ARGV[1])
for _, setKey in ipairs(stale) do
    local cut = string.find(setKey, ":[^:]*$")
    local groupKey = string.sub(setKey, 1, cut - 1)
    local res = redis.call("ZRANGE", setKey, 0, -1, "WITHSCORES")
    for i = 1, #res - 1, 2 do
        redis.call("ZADD", groupKey, tonumber(res[i + 1]), res[i])
    end
    redis.call("DEL", setKey)
    if KEYS[2] and #res > 0 then
        redis.call("SADD", KEYS[2], string.sub(groupKey, #ARGV[2] + 1))
    end
end
redis.call("ZREMRANGEBYSCORE", KEYS[1], "-inf", ARGV[1])
return redis.status_reply("OK")

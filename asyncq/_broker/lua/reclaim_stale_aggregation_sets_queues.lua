-- Put members of aggregation sets past their deadline back into their group, over
-- many queues (asyncq; per queue what reclaim_stale_aggregation_sets.lua does).
-- ARGV[1] now, unix seconds
-- ARGV[2..] queue names; keys are built from them (asynq:{<q>}:aggregation_sets,
-- :groups, :g:<group>)
for q = 2, #ARGV do
    local base = "asynq:{" .. ARGV[q] .. "}:"
    local sets, groups, gprefix = base .. "aggregation_sets", base .. "groups", base .. "g:"
    local stale = redis.call("ZRANGEBYSCORE", sets, "-inf", ARGV[1])
    for _, setKey in ipairs(stale) do
        local cut = string.find(setKey, ":[^:]*$")
        local groupKey = string.sub(setKey, 1, cut - 1)
        local res = redis.call("ZRANGE", setKey, 0, -1, "WITHSCORES")
        for i = 1, #res - 1, 2 do
            redis.call("ZADD", groupKey, tonumber(res[i + 1]), res[i])
        end
        redis.call("DEL", setKey)
        if #res > 0 then
            redis.call("SADD", groups, string.sub(groupKey, #gprefix + 1))
        end
    end
    if #stale > 0 then
        redis.call("ZREMRANGEBYSCORE", sets, "-inf", ARGV[1])
    end
end
return redis.status_reply("OK")

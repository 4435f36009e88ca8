-- Put members of aggregation sets past their deadline back into their group, over
-- many queues (asyncq; per queue what reclaim_stale_aggregation_sets.lua does).
-- KEYS[2i+1], KEYS[2i+2] aggregation_sets, groups of the i-th queue (0-based)
-- ARGV[1] now, unix seconds
-- ARGV[2+i] group key prefix of the i-th queue  asynq:{q}:g:
-- K and A are KEYS and ARGV (see multiqueue.py: on a cluster the keys come in ARGV).
for q = 1, #K / 2 do
    local sets, groups = K[2 * q - 1], K[2 * q]
    local gprefix = A[1 + q]
    local stale = redis.call("ZRANGEBYSCORE", sets, "-inf", A[1])
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
        redis.call("ZREMRANGEBYSCORE", sets, "-inf", A[1])
    end
end
return redis.status_reply("OK")

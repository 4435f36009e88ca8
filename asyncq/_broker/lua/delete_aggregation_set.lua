-- Drop a staged set after its aggregate task was enqueued (asynq DeleteAggregationSet).
-- KEYS[1] aggregation set
-- KEYS[2] aggregation_sets
-- ARGV[1] task key prefix
for _, id in ipairs(redis.call("ZRANGE", KEYS[1], 0, -1)) do
    redis.call("DEL", ARGV[1] .. id)
end
redis.call("DEL", KEYS[1])
redis.call("ZREM", KEYS[2], KEYS[1])
return redis.status_reply("OK")

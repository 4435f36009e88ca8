-- Inspector: delete every task of one group (asynq DeleteAllAggregatingTasks).
-- KEYS[1] group sorted set  KEYS[2] groups  ARGV[1] task key prefix  ARGV[2] group name
-- Returns the number of task hashes deleted.
local n = 0
for _, id in ipairs(redis.call("ZRANGE", KEYS[1], 0, -1)) do
    n = n + redis.call("DEL", ARGV[1] .. id)
end
redis.call("SREM", KEYS[2], ARGV[2])
redis.call("DEL", KEYS[1])
return n

-- Inspector: move every task of one group to pending (asynq RunAllAggregatingTasks).
-- KEYS[1] group sorted set  KEYS[2] pending  KEYS[3] groups
-- ARGV[1] task key prefix  ARGV[2] group name
-- ARGV[3] (asyncq, optional) now in unix ns, written as pending_since
-- Returns the number of tasks moved.
local n = 0
for _, id in ipairs(redis.call("ZRANGE", KEYS[1], 0, -1)) do
    local key = ARGV[1] .. id
    if redis.call("EXISTS", key) == 1 then
        redis.call("LPUSH", KEYS[2], id)
        redis.call("HSET", key, "state", "pending")
        if ARGV[3] then
            redis.call("HSET", key, "pending_since", ARGV[3])
        end
        n = n + 1
    end
end
redis.call("DEL", KEYS[1])
redis.call("SREM", KEYS[3], ARGV[2])
return n

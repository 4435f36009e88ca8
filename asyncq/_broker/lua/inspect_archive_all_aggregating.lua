-- Inspector: archive every task of one group (asynq ArchiveAllAggregatingTasks).
-- KEYS[1] group sorted set  KEYS[2] archived  KEYS[3] groups
-- ARGV[1] now (unix s)  ARGV[2] cutoff (unix s)  ARGV[3] archive cap (10000)
-- ARGV[4] task key prefix  ARGV[5] group name
-- Trimmed tasks are deleted together with their hashes (asynq leaves the hashes).
-- Returns {archived, deleted}: the tasks moved into the archive, and the archived
-- tasks (of this call or earlier) its trimming deleted, oldest first.
local n = 0
for _, id in ipairs(redis.call("ZRANGE", KEYS[1], 0, -1)) do
    local key = ARGV[4] .. id
    if redis.call("EXISTS", key) == 1 then
        redis.call("ZADD", KEYS[2], ARGV[1], id)
        redis.call("HSET", key, "state", "archived")
        n = n + 1
    end
end
redis.call("DEL", KEYS[1])
redis.call("SREM", KEYS[3], ARGV[5])
local trimmed = 0
for _, id in ipairs(redis.call("ZRANGEBYSCORE", KEYS[2], "-inf", ARGV[2])) do
    redis.call("DEL", ARGV[4] .. id)
    redis.call("ZREM", KEYS[2], id)
    trimmed = trimmed + 1
end
for _, id in ipairs(redis.call("ZRANGE", KEYS[2], 0, -tonumber(ARGV[3]))) do
    redis.call("DEL", ARGV[4] .. id)
    redis.call("ZREM", KEYS[2], id)
    trimmed = trimmed + 1
end
return {n, trimmed}

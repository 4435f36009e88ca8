-- Delete completed tasks whose retention expired (asynq janitor, one batch).
-- KEYS[1] completed
-- ARGV[1] now, unix seconds
-- ARGV[2] task key prefix
-- ARGV[3] batch size
-- Returns the number of tasks deleted.
local ids = redis.call("ZRANGEBYSCORE", KEYS[1], "-inf", ARGV[1], "LIMIT", 0, tonumber(ARGV[3]))
for _, id in ipairs(ids) do
    redis.call("DEL", ARGV[2] .. id)
    redis.call("ZREM", KEYS[1], id)
end
return #ids

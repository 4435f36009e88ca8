-- Inspector: every group of a queue with its size (asynq GroupStats).
-- KEYS[1] groups  ARGV[1] group key prefix
-- Returns a flat list of (group name, size) pairs.
local res = {}
for _, gname in ipairs(redis.call("SMEMBERS", KEYS[1])) do
    table.insert(res, gname)
    table.insert(res, redis.call("ZCARD", ARGV[1] .. gname))
end
return res

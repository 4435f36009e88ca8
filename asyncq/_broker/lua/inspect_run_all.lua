-- Inspector: move every task of a sorted set (scheduled, retry, archived) to pending
-- (asynq RunAll*Tasks).
-- KEYS[1] source sorted set  KEYS[2] pending
-- ARGV[1] task key prefix
-- ARGV[2] (asyncq, optional) now in unix ns, written as pending_since
-- IDs whose task hash is gone are dropped from the set, never pushed to pending.
-- Returns the number of tasks moved.
local n = 0
for _, id in ipairs(redis.call("ZRANGE", KEYS[1], 0, -1)) do
    local key = ARGV[1] .. id
    if redis.call("EXISTS", key) == 1 then
        redis.call("LPUSH", KEYS[2], id)
        redis.call("HSET", key, "state", "pending")
        if ARGV[2] then
            redis.call("HSET", key, "pending_since", ARGV[2])
        end
        n = n + 1
    end
end
redis.call("DEL", KEYS[1])
return n

-- Inspector: remove a queue's keys (asynq RemoveQueue, force and non-force in one).
-- KEYS[1] pending  KEYS[2] active  KEYS[3] scheduled  KEYS[4] retry  KEYS[5] archived
-- KEYS[6] lease
-- asyncq appends: KEYS[7] completed  KEYS[8] groups  KEYS[9] aggregation_sets
--                 KEYS[10] paused
-- ARGV[1] task key prefix  ARGV[2] "1" to force  ARGV[3] group key prefix
-- Returns 1 removed, -1 not empty (without force), -2 has active tasks (with force).
-- Unlike asynq, completed and aggregating tasks count as tasks (a non-forced removal
-- refuses them, a forced one deletes them with their hashes), so removing a queue
-- never leaves task hashes behind that no Inspector can reach any more.
local force = ARGV[2] == "1"
local groups = redis.call("SMEMBERS", KEYS[8])
if redis.call("LLEN", KEYS[2]) > 0 then
    if force then
        return -2
    end
    return -1
end
if not force then
    if redis.call("LLEN", KEYS[1]) > 0 or redis.call("ZCARD", KEYS[3]) > 0
        or redis.call("ZCARD", KEYS[4]) > 0 or redis.call("ZCARD", KEYS[5]) > 0
        or redis.call("ZCARD", KEYS[7]) > 0 or redis.call("ZCARD", KEYS[9]) > 0 then
        return -1
    end
    for _, gname in ipairs(groups) do
        if redis.call("ZCARD", ARGV[3] .. gname) > 0 then
            return -1
        end
    end
end
local function drop(id)
    local key = ARGV[1] .. id
    local unique_key = redis.call("HGET", key, "unique_key")
    -- pcall: a key of another type at the lock's name is no lock of this task's;
    -- it is left alone (GET's WRONGTYPE would stop the script half-way).
    if unique_key and unique_key ~= "" and redis.pcall("GET", unique_key) == id then
        redis.call("DEL", unique_key)
    end
    redis.call("DEL", key)
end
for _, id in ipairs(redis.call("LRANGE", KEYS[1], 0, -1)) do
    drop(id)
end
for _, i in ipairs({3, 4, 5, 7}) do
    for _, id in ipairs(redis.call("ZRANGE", KEYS[i], 0, -1)) do
        drop(id)
    end
end
for _, gname in ipairs(groups) do
    local gkey = ARGV[3] .. gname
    for _, id in ipairs(redis.call("ZRANGE", gkey, 0, -1)) do
        drop(id)
    end
    redis.call("DEL", gkey)
end
-- Only this queue's sets are followed: an entry naming any other key (a damaged
-- index) goes with the index, and another queue's set is never emptied from here.
for _, setkey in ipairs(redis.call("ZRANGE", KEYS[9], 0, -1)) do
    if string.sub(setkey, 1, #ARGV[3]) == ARGV[3] then
        for _, id in ipairs(redis.call("ZRANGE", setkey, 0, -1)) do
            drop(id)
        end
        redis.call("DEL", setkey)
    end
end
for i = 1, 10 do
    redis.call("DEL", KEYS[i])
end
return 1

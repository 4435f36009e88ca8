-- Inspector: delete every pending task (asynq DeleteAllPendingTasks).
-- KEYS[1] pending  ARGV[1] task key prefix
-- Unlike asynq, also releases each task's uniqueness lock when the task owns it,
-- as deleting a single task does.
-- Returns the number of task hashes deleted.
local n = 0
for _, id in ipairs(redis.call("LRANGE", KEYS[1], 0, -1)) do
    local key = ARGV[1] .. id
    local unique_key = redis.call("HGET", key, "unique_key")
    -- pcall: a key of another type at the lock's name is no lock of this task's;
    -- it is left alone (GET's WRONGTYPE would stop the script half-way).
    if unique_key and unique_key ~= "" and redis.pcall("GET", unique_key) == id then
        redis.call("DEL", unique_key)
    end
    n = n + redis.call("DEL", key)
end
redis.call("DEL", KEYS[1])
return n

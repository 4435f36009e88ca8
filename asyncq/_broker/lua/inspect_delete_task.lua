-- include: guard
-- Inspector: delete one task (asynq DeleteTask).
-- KEYS[1] task key  KEYS[2] groups
-- ARGV[1] task ID  ARGV[2] queue key prefix  ARGV[3] group key prefix
-- Releases the task's uniqueness lock when the task still owns it.
-- Returns 1 deleted, 0 not found, -1 active.
if redis.call("EXISTS", KEYS[1]) == 0 then
    return 0
end
local state, group = unpack(redis.call("HMGET", KEYS[1], "state", "group"))
if not state then
    return redis.error_reply("internal error: task hash has no state field: " .. KEYS[1])
end
-- asyncq: every key written below is checked before the first write, so a
-- failed call changes nothing.
local ukey = redis.call("HGET", KEYS[1], "unique_key")
local problem = (state == "aggregating" and group and bad(KEYS[2], "set"))
    or (ukey and ukey ~= "" and bad(ukey, "string")) or nil
if problem then
    return redis.error_reply(problem)
end
if state == "active" then
    return -1
elseif state == "pending" then
    local lkey = ARGV[2] .. "pending"
    if redis.call("LREM", lkey, 0, ARGV[1]) == 0 then
        return redis.error_reply("internal error: task id not found in list " .. lkey)
    end
elseif state == "aggregating" then
    local gkey = ARGV[3] .. (group or "")
    if redis.call("ZREM", gkey, ARGV[1]) == 0 then
        return redis.error_reply("internal error: task id not found in zset " .. gkey)
    end
    if redis.call("ZCARD", gkey) == 0 then
        redis.call("SREM", KEYS[2], group)
    end
else
    local skey = ARGV[2] .. state
    if redis.call("ZREM", skey, ARGV[1]) == 0 then
        return redis.error_reply("internal error: task id not found in zset " .. skey)
    end
end
local unique_key = redis.call("HGET", KEYS[1], "unique_key")
if unique_key and unique_key ~= "" and redis.call("GET", unique_key) == ARGV[1] then
    redis.call("DEL", unique_key)
end
return redis.call("DEL", KEYS[1])

-- include: guard
-- Inspector: archive one task (asynq ArchiveTask).
-- KEYS[1] task key  KEYS[2] archived  KEYS[3] groups
-- ARGV[1] task ID  ARGV[2] now (unix s)  ARGV[3] cutoff = now - 90 days (unix s)
-- ARGV[4] archive cap (10000)  ARGV[5] queue key prefix  ARGV[6] group key prefix
-- Returns 1 done, 0 not found, -1 already archived, -2 active.
-- Unlike released asynq, the trim of archived tasks older than the cutoff or beyond
-- the cap also deletes their task hashes, so no hash is left unreachable.
if redis.call("EXISTS", KEYS[1]) == 0 then
    return 0
end
local state, group = unpack(redis.call("HMGET", KEYS[1], "state", "group"))
if not state then
    return redis.error_reply("internal error: task hash has no state field: " .. KEYS[1])
end
-- asyncq: every key written below is checked before the first write, so a
-- failed call changes nothing.
local problem = bad(KEYS[2], "zset")
    or (state == "aggregating" and group and bad(KEYS[3], "set")) or nil
if problem then
    return redis.error_reply(problem)
end
if state == "active" then
    return -2
elseif state == "archived" then
    return -1
elseif state == "pending" then
    local lkey = ARGV[5] .. "pending"
    -- Every copy (asyncq; asynq removes one): a copy left behind would be taken by a
    -- worker and run the task while it is archived.
    if redis.call("LREM", lkey, 0, ARGV[1]) == 0 then
        return redis.error_reply("internal error: task id not found in list " .. lkey)
    end
elseif state == "aggregating" then
    local gkey = ARGV[6] .. (group or "")
    if redis.call("ZREM", gkey, ARGV[1]) == 0 then
        return redis.error_reply("internal error: task id not found in zset " .. gkey)
    end
    if redis.call("ZCARD", gkey) == 0 then
        redis.call("SREM", KEYS[3], group)
    end
else
    local skey = ARGV[5] .. state
    if redis.call("ZREM", skey, ARGV[1]) == 0 then
        return redis.error_reply("internal error: task id not found in zset " .. skey)
    end
end
redis.call("ZADD", KEYS[2], ARGV[2], ARGV[1])
redis.call("HSET", KEYS[1], "state", "archived")
local tprefix = ARGV[5] .. "t:"
local old = redis.call("ZRANGEBYSCORE", KEYS[2], "-inf", ARGV[3])
for _, id in ipairs(old) do
    redis.call("DEL", tprefix .. id)
    redis.call("ZREM", KEYS[2], id)
end
local excess = redis.call("ZRANGE", KEYS[2], 0, -tonumber(ARGV[4]))
for _, id in ipairs(excess) do
    redis.call("DEL", tprefix .. id)
    redis.call("ZREM", KEYS[2], id)
end
return 1

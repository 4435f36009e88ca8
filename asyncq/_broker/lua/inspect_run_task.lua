-- include: guard
-- Inspector: move one task to pending (asynq RunTask).
-- KEYS[1] task key  KEYS[2] pending  KEYS[3] groups
-- ARGV[1] task ID  ARGV[2] queue key prefix  ARGV[3] group key prefix
-- ARGV[4] (asyncq, optional) now in unix ns, written as pending_since so that the
--         queue latency counts from the moment the task became pending
-- Returns 1 done, 0 not found, -1 active, -2 already pending.
if redis.call("EXISTS", KEYS[1]) == 0 then
    return 0
end
local state, group = unpack(redis.call("HMGET", KEYS[1], "state", "group"))
if not state then
    return redis.error_reply("internal error: task hash has no state field: " .. KEYS[1])
end
-- asyncq: every key written below is checked before the first write, so a
-- failed call changes nothing.
local problem = bad(KEYS[2], "list")
    or (state == "aggregating" and group and bad(KEYS[3], "set")) or nil
if problem then
    return redis.error_reply(problem)
end
if state == "active" then
    return -1
elseif state == "pending" then
    return -2
elseif state == "aggregating" then
    local gkey = ARGV[3] .. (group or "")
    if redis.call("ZREM", gkey, ARGV[1]) == 0 then
        return redis.error_reply("internal error: task id not found in zset " .. gkey)
    end
    if redis.call("ZCARD", gkey) == 0 then
        redis.call("SREM", KEYS[3], group)
    end
else
    local skey = ARGV[2] .. state
    if redis.call("ZREM", skey, ARGV[1]) == 0 then
        return redis.error_reply("internal error: task id not found in zset " .. skey)
    end
end
redis.call("LPUSH", KEYS[2], ARGV[1])
redis.call("HSET", KEYS[1], "state", "pending")
if ARGV[4] then
    redis.call("HSET", KEYS[1], "pending_since", ARGV[4])
end
return 1

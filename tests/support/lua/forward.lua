-- include: guard
-- Move due scheduled or retry tasks on (asynq ForwardIfReady, one batch of 100).
-- KEYS[1] scheduled or retry
-- KEYS[2] pending
-- KEYS[3] asyncq: groups (optional; see below)
-- ARGV[1] now, unix seconds
-- ARGV[2] task key prefix
-- ARGV[3] now, unix nanoseconds (pending_since)
-- ARGV[4] group key prefix  asynq:{q}:g:
-- ARGV[5] asyncq: wake-up channel (optional), ARGV[6] message published on it
-- A task whose hash has a group goes back into that group (state aggregating);
-- asyncq also re-adds the group name to KEYS[3] so the aggregator sees it again
-- (asynq leaves it out, stranding the group until another task joins it).
-- Others are LPUSHed to pending with state=pending and pending_since.
-- An id without a hash is only dropped from KEYS[1]: there is nothing to run.
-- Returns the number of ids handled (0 when none were due).
-- The wake-up is an optimisation: redis.pcall, so that a user whose ACL forbids the
-- channel still gets the write (an error here would come after the write).
local ids = redis.call("ZRANGEBYSCORE", KEYS[1], "-inf", ARGV[1], "LIMIT", 0, 100)
-- asyncq: every key written below is checked before the first write (a task hash
-- or a group of another type, a pending list or group set of another type), so a
-- failed call changes nothing.
local groups = {}
if #ids > 0 then
    local problem = bad(KEYS[2], "list") or (KEYS[3] and bad(KEYS[3], "set"))
    for i, id in ipairs(ids) do
        if problem then
            break
        end
        local key = ARGV[2] .. id
        problem = bad(key, "hash")
        if not problem then
            local group = redis.call("HGET", key, "group")
            groups[i] = group
            if group and group ~= "" then
                problem = bad(ARGV[4] .. group, "zset")
            end
        end
    end
    if problem then
        return redis.error_reply(problem)
    end
end
local wake = false
for i, id in ipairs(ids) do
    local key = ARGV[2] .. id
    local group = groups[i]
    if group and group ~= "" then
        redis.call("ZADD", ARGV[4] .. group, ARGV[1], id)
        redis.call("ZREM", KEYS[1], id)
        redis.call("HSET", key, "state", "aggregating")
        if KEYS[3] then
            redis.call("SADD", KEYS[3], group)
        end
    elseif redis.call("EXISTS", key) == 0 then
        redis.call("ZREM", KEYS[1], id)
        redis.log(redis.LOG_WARNING, "asyncq: dropped id without task hash from " .. KEYS[1] .. ": " .. id)
    else
        if redis.call("LPUSH", KEYS[2], id) == 1 then
            wake = true
        end
        redis.call("ZREM", KEYS[1], id)
        redis.call("HSET", key, "state", "pending", "pending_since", ARGV[3])
    end
end
if wake and ARGV[5] then
    redis.pcall("PUBLISH", ARGV[5], ARGV[6])
end
return #ids

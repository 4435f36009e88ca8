-- Move due scheduled and retry tasks on for many queues in one call (asyncq;
-- per queue exactly what forward.lua does, asynq's ForwardIfReady).
-- ARGV[1] now, unix seconds
-- ARGV[2] now, unix nanoseconds (pending_since)
-- ARGV[3] most ids to move per scheduled/retry set in this call
-- ARGV[4..] queue names; keys are built from them (asynq:{<q>}:scheduled, ...)
-- Returns {moved, more}: the number of ids handled, and 1 when a set still had
-- ARGV[3] due ids (call again), else 0.
local limit = tonumber(ARGV[3])
local moved = 0
local more = 0
for q = 4, #ARGV do
    local name = ARGV[q]
    local base = "asynq:{" .. name .. "}:"
    local prefix, gprefix = base .. "t:", base .. "g:"
    local pending, groups = base .. "pending", base .. "groups"
    local wake = false
    for _, source in ipairs({base .. "scheduled", base .. "retry"}) do
        local ids = redis.call("ZRANGEBYSCORE", source, "-inf", ARGV[1], "LIMIT", 0, limit)
        if #ids == limit then
            more = 1
        end
        for _, id in ipairs(ids) do
            local key = prefix .. id
            local group = redis.call("HGET", key, "group")
            if group and group ~= "" then
                redis.call("ZADD", gprefix .. group, ARGV[1], id)
                redis.call("ZREM", source, id)
                redis.call("HSET", key, "state", "aggregating")
                redis.call("SADD", groups, group)
            elseif redis.call("EXISTS", key) == 0 then
                redis.call("ZREM", source, id)
                redis.log(redis.LOG_WARNING, "asyncq: dropped id without task hash from " .. source .. ": " .. id)
            else
                if redis.call("LPUSH", pending, id) == 1 then
                    wake = true
                end
                redis.call("ZREM", source, id)
                redis.call("HSET", key, "state", "pending", "pending_since", ARGV[2])
            end
        end
        moved = moved + #ids
    end
    if wake then
        redis.pcall("PUBLISH", "asyncq:wakeup:{" .. name .. "}", name)
    end
end
return {moved, more}

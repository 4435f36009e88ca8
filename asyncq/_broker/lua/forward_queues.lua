-- Move due scheduled and retry tasks on for many queues in one call (asyncq;
-- per queue exactly what forward.lua does, asynq's ForwardIfReady).
-- KEYS[4i+1..4i+4] scheduled, retry, pending, groups of the i-th queue (0-based)
-- ARGV[1] now, unix seconds
-- ARGV[2] now, unix nanoseconds (pending_since)
-- ARGV[3] most ids to move per scheduled/retry set in this call
-- ARGV[4i+4..4i+7] task key prefix, group key prefix, wake-up channel, queue name
-- Returns {moved, more}: the number of ids handled, and 1 when a set still had
-- ARGV[3] due ids (call again), else 0.
-- K and A are KEYS and ARGV (see multiqueue.py: on a cluster the keys come in ARGV).
local limit = tonumber(A[3])
local moved = 0
local more = 0
for q = 1, #K / 4 do
    local base = (q - 1) * 4
    local a = 4 * (q - 1) + 4
    local prefix, gprefix = A[a], A[a + 1]
    local pending, groups = K[base + 3], K[base + 4]
    local wake = false
    for s = 1, 2 do
        local source = K[base + s]
        local ids = redis.call("ZRANGEBYSCORE", source, "-inf", A[1], "LIMIT", 0, limit)
        if #ids == limit then
            more = 1
        end
        for _, id in ipairs(ids) do
            local key = prefix .. id
            local group = redis.call("HGET", key, "group")
            if group and group ~= "" then
                redis.call("ZADD", gprefix .. group, A[1], id)
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
                redis.call("HSET", key, "state", "pending", "pending_since", A[2])
            end
        end
        moved = moved + #ids
    end
    if wake then
        redis.pcall("PUBLISH", A[a + 2], A[a + 3])
    end
end
return {moved, more}

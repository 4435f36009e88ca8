-- Stage an aggregation set when a group is ready (asynq AggregationCheck).
-- KEYS[1] group             asynq:{q}:g:<group>
-- KEYS[2] aggregation set   asynq:{q}:g:<group>:<set id>
-- KEYS[3] aggregation_sets
-- KEYS[4] groups
-- ARGV[1] max size (0 = unlimited)
-- ARGV[2] max delay, whole seconds (0 = unlimited)
-- ARGV[3] grace period, whole seconds
-- ARGV[4] set deadline, unix seconds (now + 2 min)
-- ARGV[5] check time, unix seconds
-- ARGV[6] group name
-- Returns 1 when a set was staged in KEYS[2], else 0.
local size = redis.call("ZCARD", KEYS[1])
if size == 0 then
    return 0
end
local maxSize = tonumber(ARGV[1])
local now = tonumber(ARGV[5])

-- Moves the oldest `count` members (all when count is 0) into the set.
local function stage(count)
    local res = redis.call("ZRANGE", KEYS[1], 0, count - 1, "WITHSCORES")
    for i = 1, #res - 1, 2 do
        redis.call("ZADD", KEYS[2], tonumber(res[i + 1]), res[i])
    end
    redis.call("ZREMRANGEBYRANK", KEYS[1], 0, count - 1)
    redis.call("ZADD", KEYS[3], ARGV[4], KEYS[2])
end

if maxSize ~= 0 and size >= maxSize then
    stage(maxSize)
    if size == maxSize then
        redis.call("SREM", KEYS[4], ARGV[6])
    end
    return 1
end

local maxDelay = tonumber(ARGV[2])
if maxDelay ~= 0 then
    local oldest = redis.call("ZRANGE", KEYS[1], 0, 0, "WITHSCORES")
    if tonumber(oldest[2]) <= now - maxDelay then
        stage(maxSize)
        if maxSize == 0 or size <= maxSize then
            redis.call("SREM", KEYS[4], ARGV[6])
        end
        return 1
    end
end

local newest = redis.call("ZREVRANGE", KEYS[1], 0, 0, "WITHSCORES")
if tonumber(newest[2]) <= now - tonumber(ARGV[3]) then
    stage(maxSize)
    if maxSize == 0 or size <= maxSize then
        redis.call("SREM", KEYS[4], ARGV[6])
    end
    return 1
end
return 0

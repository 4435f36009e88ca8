-- Inspector: approximate memory used by one queue's tasks (asynq memoryUsage, with
-- the nil guard of asynq HEAD #1092: an ID whose task hash is gone is skipped instead
-- of breaking the arithmetic).
-- KEYS[1] active  KEYS[2] pending  KEYS[3] scheduled  KEYS[4] retry
-- KEYS[5] archived  KEYS[6] completed  KEYS[7] groups
-- ARGV[1] task key prefix  ARGV[2] sample size (20)  ARGV[3] group sample size (5)
-- ARGV[4] group key prefix
local sample_size = tonumber(ARGV[2])
if sample_size == nil or sample_size <= 0 then
    return redis.error_reply("sample size must be a positive number")
end
local function sampled_average(ids)
    local total, n = 0, 0
    for _, id in ipairs(ids) do
        local bytes = redis.call("MEMORY", "USAGE", ARGV[1] .. id)
        if bytes then
            total = total + bytes
            n = n + 1
        end
    end
    return total, n
end
local usage = 0
for i = 1, 6 do
    local ids, size
    if i <= 2 then
        ids = redis.call("LRANGE", KEYS[i], 0, sample_size - 1)
        size = redis.call("LLEN", KEYS[i])
    else
        ids = redis.call("ZRANGE", KEYS[i], 0, sample_size - 1)
        size = redis.call("ZCARD", KEYS[i])
    end
    local total, n = sampled_average(ids)
    if n > 0 then
        usage = usage + (total / n) * size
    end
    local own = redis.call("MEMORY", "USAGE", KEYS[i])
    if own then
        usage = usage + own
    end
end
local groups = redis.call("SMEMBERS", KEYS[7])
if #groups > 0 then
    local task_count, sample_total, sample_n = 0, 0, 0
    for i, gname in ipairs(groups) do
        local gkey = ARGV[4] .. gname
        task_count = task_count + redis.call("ZCARD", gkey)
        if i <= tonumber(ARGV[3]) then
            local total, n = sampled_average(redis.call("ZRANGE", gkey, 0, sample_size - 1))
            sample_total = sample_total + total
            sample_n = sample_n + n
        end
    end
    if sample_n > 0 then
        usage = usage + (sample_total / sample_n) * task_count
    end
end
return math.floor(usage)

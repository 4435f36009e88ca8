-- asyncq workflows: cancel a running workflow. Its state becomes canceled (finishing
-- steps no longer hand off) and the members of the current stage that have not
-- started (pending, scheduled or retry) are deleted. A member a plain asynq (Go) worker
-- already finished, which left no hand-off, counts as resolved too: completed (with a
-- retention) as succeeded, archived as failed; that task itself is kept.
-- KEYS[1] workflow hash
-- ARGV[1] now (unix s)
-- Returns the workflow's state before the call, or false when it does not exist.
local wf = KEYS[1]
local state = redis.call("HGET", wf, "state")
if not state then
    return false
end
if state ~= "running" then
    return state
end
redis.call("HSET", wf, "state", "canceled", "finished", ARGV[1])
local stage = redis.call("HGET", wf, "stage")
local n = tonumber(redis.call("HGET", wf, "n:" .. stage))
local left = tonumber(redis.call("HGET", wf, "left:" .. stage))
for j = 0, n - 1 do
    local m = stage .. ":" .. j
    if redis.call("HGET", wf, "st:" .. m) == "pending" then
        local id = redis.call("HGET", wf, "id:" .. m)
        local q = redis.call("HGET", wf, "q:" .. m)
        local tkey = "asynq:{" .. q .. "}:t:" .. id
        local ts = redis.call("HGET", tkey, "state")
        local removed = 0
        if ts == "pending" then
            removed = redis.call("LREM", "asynq:{" .. q .. "}:pending", 0, id)
        elseif ts == "scheduled" or ts == "retry" then
            removed = redis.call("ZREM", "asynq:{" .. q .. "}:" .. ts, id)
        end
        if ts == false then
            removed = 1  -- no task any more (deleted, or acknowledged by a plain asynq worker)
        end
        if removed > 0 then
            redis.call("DEL", tkey)
            redis.call("HSET", wf, "st:" .. m, "canceled")
            left = redis.call("HINCRBY", wf, "left:" .. stage, -1)
        elseif ts == "completed" or ts == "archived" then
            redis.call("HSET", wf, "st:" .. m, ts == "completed" and "succeeded" or "failed")
            left = redis.call("HINCRBY", wf, "left:" .. stage, -1)
        end
    end
end
if left <= 0 then
    local ttl = tonumber(redis.call("HGET", wf, "ttl"))
    if ttl > 0 then
        redis.call("EXPIRE", wf, ttl)
    else
        redis.call("DEL", wf)
    end
else
    redis.call("EXPIRE", wf, math.max(tonumber(redis.call("HGET", wf, "ttl")), 604800))
end
return state

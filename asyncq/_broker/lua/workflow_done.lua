-- asyncq workflows: acknowledge a step of a workflow and, in the same script, record
-- its outcome in the workflow hash and enqueue the next stage when this was the
-- stage's last member. Used only for tasks carrying the asyncq-workflow header.
-- KEYS[1] active            KEYS[2] lease              KEYS[3] task key
-- KEYS[4] processed:<day>   KEYS[5] processed (all)    KEYS[6] completed
-- KEYS[7] archived          KEYS[8] failed:<day>       KEYS[9] failed (all)
-- KEYS[10] task key prefix of the step's queue         KEYS[11] workflow hash
-- ARGV[1] task id    ARGV[2] mode: done | complete | archive | revoke
-- ARGV[3] expiry of the daily counters (unix s)   ARGV[4] max int64   ARGV[5] now (unix s)
-- ARGV[6] msg to store (complete: completed_at set; archive: error set)
-- ARGV[7] completed score (complete)   ARGV[8] stage   ARGV[9] member index
-- ARGV[10] error message (archive/revoke)   ARGV[11] archive cutoff (unix s)
-- ARGV[12] archive size limit   ARGV[13] now (unix ns, pending_since)
-- Next-stage keys are built from the queue names stored in the workflow hash; on
-- Redis Cluster every step shares the workflow's hash slot (checked when it starts).
local mode = ARGV[2]
if redis.call("LREM", KEYS[1], 0, ARGV[1]) == 0 then
    return redis.error_reply("NOT FOUND")
end
if redis.call("ZREM", KEYS[2], ARGV[1]) == 0 then
    return redis.error_reply("NOT FOUND")
end
local result = redis.call("HGET", KEYS[3], "result")
if mode == "done" or mode == "revoke" then
    if redis.call("DEL", KEYS[3]) == 0 then
        return redis.error_reply("NOT FOUND")
    end
elseif mode == "complete" then
    redis.call("ZADD", KEYS[6], ARGV[7], ARGV[1])
    redis.call("HSET", KEYS[3], "msg", ARGV[6], "state", "completed")
else
    redis.call("ZADD", KEYS[7], ARGV[5], ARGV[1])
    for _, range in ipairs({
        redis.call("ZRANGE", KEYS[7], "-inf", ARGV[11], "BYSCORE"),
        redis.call("ZRANGE", KEYS[7], 0, -tonumber(ARGV[12])),
    }) do
        for _, id in ipairs(range) do
            if id ~= ARGV[1] then
                redis.call("DEL", KEYS[10] .. id)
                redis.call("ZREM", KEYS[7], id)
            end
        end
    end
    redis.call("HSET", KEYS[3], "msg", ARGV[6], "state", "archived")
    if redis.call("INCR", KEYS[8]) == 1 then
        redis.call("EXPIREAT", KEYS[8], ARGV[3])
    end
end
if redis.call("INCR", KEYS[4]) == 1 then
    redis.call("EXPIREAT", KEYS[4], ARGV[3])
end
if redis.call("GET", KEYS[5]) == ARGV[4] then
    redis.call("SET", KEYS[5], 1)
    if mode == "archive" then redis.call("SET", KEYS[9], 1) end
else
    redis.call("INCR", KEYS[5])
    if mode == "archive" then redis.call("INCR", KEYS[9]) end
end

-- the workflow part
local wf = KEYS[11]
local state = redis.call("HGET", wf, "state")
if not state then
    return "gone"  -- expired or never written: the step was acknowledged as a plain task
end
local stage = tonumber(ARGV[8])
local member = stage .. ":" .. ARGV[9]
local seen = redis.call("HGET", wf, "st:" .. member)
if seen == "succeeded" or seen == "failed" or seen == "canceled" then
    return "seen"
end
local ok = mode == "done" or mode == "complete"
if ok then
    redis.call("HSET", wf, "st:" .. member, "succeeded")
    if result then
        redis.call("HSET", wf, "r:" .. member, result)
    end
else
    redis.call("HSET", wf, "st:" .. member, "failed", "e:" .. member, ARGV[10])
end
local left = redis.call("HINCRBY", wf, "left:" .. stage, -1)
local ttl = tonumber(redis.call("HGET", wf, "ttl"))
local function finish(final)
    redis.call("HSET", wf, "state", final, "finished", ARGV[5])
end
local function settle()
    if ttl > 0 then
        redis.call("EXPIRE", wf, ttl)
    else
        redis.call("DEL", wf)
    end
end
if state ~= "running" then
    if left <= 0 then settle() end
    return state
end
if not ok and redis.call("HGET", wf, "policy") == "fail" then
    finish("failed")
    if left <= 0 then
        settle()
    else
        -- members still out: the state stays readable a while, never forever
        redis.call("EXPIRE", wf, math.max(ttl, 604800))
    end
    return "failed"
end
if left > 0 then
    return "running"
end
local nstages = tonumber(redis.call("HGET", wf, "stages"))
local nxt = stage + 1
if nxt >= nstages then
    finish("succeeded")
    settle()
    return "succeeded"
end

-- hand-off: the next stage, from the messages stored when the workflow started
local function varint(n)
    local s = ""
    while n >= 128 do
        s = s .. string.char(n % 128 + 128)
        n = math.floor(n / 128)
    end
    return s .. string.char(n)
end
local done_n = tonumber(redis.call("HGET", wf, "n:" .. stage))
local pass = redis.call("HGET", wf, "pass:" .. nxt)
local payload = nil
if pass then
    local rs = {}
    for i = 0, done_n - 1 do
        local r = redis.call("HGET", wf, "r:" .. stage .. ":" .. i)
        local e = redis.call("HGET", wf, "e:" .. stage .. ":" .. i)
        rs[#rs + 1] = {r, e}
    end
    if string.sub(pass, 1, 1) == "b" then
        if done_n == 1 and string.sub(pass, 2, 2) ~= "l" then
            payload = rs[1][1] or ""
        else
            local parts = {}
            for _, p in ipairs(rs) do
                if p[2] then
                    parts[#parts + 1] = "E" .. #p[2] .. ":" .. p[2]
                else
                    local r = p[1] or ""
                    parts[#parts + 1] = "R" .. #r .. ":" .. r
                end
            end
            payload = table.concat(parts)
        end
    else
        local vals = {}
        for _, p in ipairs(rs) do
            if p[2] or not p[1] or p[1] == "" then
                vals[#vals + 1] = "null"
            else
                vals[#vals + 1] = p[1]
            end
        end
        if done_n == 1 and string.sub(pass, 2, 2) ~= "l" then
            payload = vals[1]
        else
            payload = "[" .. table.concat(vals, ",") .. "]"
        end
        payload = string.sub(pass, 3) .. ":" .. payload  -- "key":value
    end
end
local n = tonumber(redis.call("HGET", wf, "n:" .. nxt))
for j = 0, n - 1 do
    local m = nxt .. ":" .. j
    local msg = redis.call("HGET", wf, "m:" .. m)
    local id = redis.call("HGET", wf, "id:" .. m)
    local q = redis.call("HGET", wf, "q:" .. m)
    if payload then
        local body = payload
        if string.sub(pass, 1, 1) == "j" then
            local base = redis.call("HGET", wf, "p:" .. m) or "{}"
            if base == "{}" then
                body = "{" .. payload .. "}"
            else
                body = "{" .. payload .. "," .. string.sub(base, 2)
            end
        end
        -- a second payload field (2) at the end: protobuf readers keep the last one
        msg = msg .. "\18" .. varint(#body) .. body
    end
    local tkey = "asynq:{" .. q .. "}:t:" .. id
    if redis.call("EXISTS", tkey) == 0 then
        redis.call("HSET", tkey, "msg", msg, "state", "pending", "pending_since", ARGV[13])
        redis.call("LPUSH", "asynq:{" .. q .. "}:pending", id)
        redis.pcall("PUBLISH", "asyncq:wakeup:{" .. q .. "}", q)
    end
    redis.call("HSET", wf, "st:" .. m, "pending")
    redis.call("HDEL", wf, "m:" .. m)
end
redis.call("HSET", wf, "stage", nxt)
return "running"

-- asyncq workflows: record a member's outcome in the workflow hash and, when it was
-- its stage's last, enqueue the next stage. Shared by workflow_done.lua and
-- workflow_member_gone.lua (prepended to them when they are loaded).
-- wf: workflow hash; stage_arg, member_arg: the member's place; ok: succeeded;
-- result: its result bytes (or false); err: its error (when not ok);
-- now_s / now_ns: unix seconds / nanoseconds.
-- Returns the workflow's state afterwards ("gone" when its hash does not exist,
-- "seen" when this member's outcome was already recorded).
local function advance(wf, stage_arg, member_arg, ok, result, err, now_s, now_ns)
    local state = redis.call("HGET", wf, "state")
    if not state then
        return "gone"  -- expired or never written: the step was acknowledged as a plain task
    end
    local stage = tonumber(stage_arg)
    local member = stage .. ":" .. member_arg
    local seen = redis.call("HGET", wf, "st:" .. member)
    if seen == "succeeded" or seen == "failed" or seen == "canceled" then
        return "seen"
    end
    if ok then
        redis.call("HSET", wf, "st:" .. member, "succeeded")
        if result then
            redis.call("HSET", wf, "r:" .. member, result)
        end
    else
        redis.call("HSET", wf, "st:" .. member, "failed", "e:" .. member, err)
    end
    local left = redis.call("HINCRBY", wf, "left:" .. stage, -1)
    local ttl = tonumber(redis.call("HGET", wf, "ttl"))
    local function finish(final)
        redis.call("HSET", wf, "state", final, "finished", now_s)
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
            redis.call("HSET", tkey, "msg", msg, "state", "pending", "pending_since", now_ns)
            redis.call("LPUSH", "asynq:{" .. q .. "}:pending", id)
            redis.pcall("PUBLISH", "asyncq:wakeup:{" .. q .. "}", q)
        end
        redis.call("HSET", wf, "st:" .. m, "pending")
        redis.call("HDEL", wf, "m:" .. m)
    end
    redis.call("HSET", wf, "stage", nxt)
    return "running"
end

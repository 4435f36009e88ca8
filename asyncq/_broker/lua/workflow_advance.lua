-- asyncq workflows: record members' outcomes in the workflow hash and, when a stage's
-- last member is recorded, enqueue the next stage. Shared by workflow_done.lua,
-- workflow_member_gone.lua and ack_many.lua (prepended to them when they are loaded).
-- wf: workflow hash; stage_arg, member_arg: a member's place; now_s / now_ns: unix
-- seconds / nanoseconds. advance() records one member's outcome, advance_ok() the
-- successes of several members of one stage at once (one acknowledgement batch);
-- both return the workflow's state afterwards ("gone" when its hash does not exist,
-- "seen" when every outcome given was already recorded).

-- Commands take their arguments on the Lua stack: long lists go in slices.
local SLICE = 1000

local function call_sliced(cmd, key, args)
    for i = 1, #args, SLICE do
        redis.call(cmd, key, unpack(args, i, math.min(i + SLICE - 1, #args)))
    end
end

local function hmget_sliced(key, fields)
    local out = {}
    for i = 1, #fields, SLICE do
        local got = redis.call("HMGET", key, unpack(fields, i, math.min(i + SLICE - 1, #fields)))
        for _, v in ipairs(got) do
            out[#out + 1] = v
        end
    end
    return out
end

local function resolved(st)
    return st == "succeeded" or st == "failed" or st == "canceled"
end

-- the workflow's state is kept for its retention once no member is out, or goes
local function settle(wf)
    local ttl = tonumber(redis.call("HGET", wf, "ttl"))
    if ttl > 0 then
        redis.call("EXPIRE", wf, ttl)
    else
        redis.call("DEL", wf)
    end
end

local function varint(n)
    local s = ""
    while n >= 128 do
        s = s .. string.char(n % 128 + 128)
        n = math.floor(n / 128)
    end
    return s .. string.char(n)
end

-- Every member of a running workflow's stage succeeded (or failed under the "run"
-- policy): enqueue the next stage from the messages stored when the workflow
-- started, or finish the workflow after its last stage.
local function next_stage(wf, stage, now_s, now_ns)
    local nstages = tonumber(redis.call("HGET", wf, "stages"))
    local nxt = stage + 1
    if nxt >= nstages then
        redis.call("HSET", wf, "state", "succeeded", "finished", now_s)
        settle(wf)
        return "succeeded"
    end
    local done_n = tonumber(redis.call("HGET", wf, "n:" .. stage))
    local pass = redis.call("HGET", wf, "pass:" .. nxt)
    local payload = nil
    if pass then
        local fields = {}
        for i = 0, done_n - 1 do
            fields[#fields + 1] = "r:" .. stage .. ":" .. i
            fields[#fields + 1] = "e:" .. stage .. ":" .. i
        end
        local got = hmget_sliced(wf, fields)
        local rs = {}
        for i = 1, #got, 2 do
            rs[#rs + 1] = {got[i], got[i + 1]}
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
    local marks, gone, pushed, queues = {}, {}, {}, {}
    for j = 0, n - 1 do
        local m = nxt .. ":" .. j
        local f = redis.call("HMGET", wf, "m:" .. m, "id:" .. m, "q:" .. m, "p:" .. m)
        local msg, id, q = f[1], f[2], f[3]
        if payload then
            local body = payload
            if string.sub(pass, 1, 1) == "j" then
                local base = f[4] or "{}"
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
            if not pushed[q] then
                pushed[q] = {}
                queues[#queues + 1] = q
            end
            local ids = pushed[q]
            ids[#ids + 1] = id
        end
        marks[#marks + 1] = "st:" .. m
        marks[#marks + 1] = "pending"
        gone[#gone + 1] = "m:" .. m
    end
    -- one LPUSH of many ids is those LPUSHes one by one, in the same order
    for _, q in ipairs(queues) do
        call_sliced("LPUSH", "asynq:{" .. q .. "}:pending", pushed[q])
        redis.pcall("PUBLISH", "asyncq:wakeup:{" .. q .. "}", q)
    end
    call_sliced("HSET", wf, marks)
    call_sliced("HDEL", wf, gone)
    redis.call("HSET", wf, "stage", nxt)
    return "running"
end

-- ok: succeeded; result: its result bytes (or false); err: its error (when not ok)
local function advance(wf, stage_arg, member_arg, ok, result, err, now_s, now_ns)
    local state = redis.call("HGET", wf, "state")
    if not state then
        return "gone"  -- expired or never written: the step was acknowledged as a plain task
    end
    local stage = tonumber(stage_arg)
    local member = stage .. ":" .. member_arg
    if resolved(redis.call("HGET", wf, "st:" .. member)) then
        return "seen"
    end
    if ok then
        if result then
            redis.call("HSET", wf, "st:" .. member, "succeeded", "r:" .. member, result)
        else
            redis.call("HSET", wf, "st:" .. member, "succeeded")
        end
    else
        redis.call("HSET", wf, "st:" .. member, "failed", "e:" .. member, err)
    end
    local left = redis.call("HINCRBY", wf, "left:" .. stage, -1)
    if state ~= "running" then
        if left <= 0 then settle(wf) end
        return state
    end
    if not ok and redis.call("HGET", wf, "policy") == "fail" then
        redis.call("HSET", wf, "state", "failed", "finished", now_s)
        if left <= 0 then
            settle(wf)
        else
            -- members still out: the state stays readable a while, never forever
            local ttl = tonumber(redis.call("HGET", wf, "ttl"))
            redis.call("EXPIRE", wf, math.max(ttl, 604800))
        end
        return "failed"
    end
    if left > 0 then
        return "running"
    end
    return next_stage(wf, stage, now_s, now_ns)
end

-- members: member indexes (strings) of one stage that succeeded; results: their
-- result bytes (or false), in the same order. The same as advance() for each in turn.
local function advance_ok(wf, stage_arg, members, results, now_s, now_ns)
    local state = redis.call("HGET", wf, "state")
    if not state then
        return "gone"
    end
    local stage = tonumber(stage_arg)
    local fields = {}
    for i, member in ipairs(members) do
        fields[i] = "st:" .. stage .. ":" .. member
    end
    local seen = hmget_sliced(wf, fields)
    local writes, taken, fresh = {}, {}, 0
    for i, member in ipairs(members) do
        if not resolved(seen[i]) and not taken[member] then
            taken[member] = true
            fresh = fresh + 1
            writes[#writes + 1] = fields[i]
            writes[#writes + 1] = "succeeded"
            if results[i] then
                writes[#writes + 1] = "r:" .. stage .. ":" .. member
                writes[#writes + 1] = results[i]
            end
        end
    end
    if fresh == 0 then
        return "seen"
    end
    call_sliced("HSET", wf, writes)
    local left = redis.call("HINCRBY", wf, "left:" .. stage, -fresh)
    if state ~= "running" then
        if left <= 0 then settle(wf) end
        return state
    end
    if left > 0 then
        return "running"
    end
    return next_stage(wf, stage, now_s, now_ns)
end

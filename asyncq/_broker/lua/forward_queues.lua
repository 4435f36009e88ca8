-- include: guard
-- Move due scheduled and retry tasks on for many queues in one call (asyncq;
-- per queue exactly what forward.lua does, asynq's ForwardIfReady).
-- ARGV[1] now, unix seconds
-- ARGV[2] now, unix nanoseconds (pending_since)
-- ARGV[3] most ids to move per scheduled/retry set in this call
-- ARGV[4] queues per EXISTS probe (1 on a cluster: one command cannot span slots)
-- ARGV[5..] queue names; keys are built from them (asynq:{<q>}:scheduled, ...)
-- The queues are looked at ARGV[4] at a time: one EXISTS over their scheduled and
-- retry sets skips a chunk of queues with nothing scheduled (empty sets do not
-- exist), so an idle worker's pass costs a few commands, not two per queue.
-- asyncq ordered queues (asynq:{<q>}:asyncq:ordered = "1"): a due retry goes to
-- the tail of pending (RPUSH, the end dequeued next) instead of the head, so the
-- failed task runs again before the tasks enqueued after it.
-- Returns {moved, more, earliest}: the number of ids handled, 1 when a set still had
-- ARGV[3] due ids (call again) else 0, and the earliest score left in the scheduled
-- and retry sets of the queues looked at ("" when none): the forwarder sleeps until
-- then, so a task moves when it is due rather than at the next fixed pass.
-- A queue with a key of another type (its scheduled or retry set, pending list,
-- groups set, a due task's hash or group) is skipped whole before anything of it
-- is written, so one damaged queue does not stop the others of the call; the
-- reply then has a fourth element listing "WRONGTYPE <key> is not a <kind>".
local limit = tonumber(ARGV[3])
local NAMES = 4
local CHUNK = tonumber(ARGV[4])
local moved = 0
local more = 0
local earliest = nil
local problems = {}
local function forward_queue(name)
    local base = "asynq:{" .. name .. "}:"
    local prefix, gprefix = base .. "t:", base .. "g:"
    local pending, groups = base .. "pending", base .. "groups"
    local wake = false
    local problem = nil
    -- Every key of the queue is checked before its first write: {source, ids, groups}.
    local work = {}
    for _, source in ipairs({base .. "scheduled", base .. "retry"}) do
        if not problem then
            local ids = redis.pcall("ZRANGEBYSCORE", source, "-inf", ARGV[1], "LIMIT", 0, limit)
            if ids.err then
                problem = bad(source, "zset") or (source .. ": " .. ids.err)
            else
                work[#work + 1] = {source, ids, {}}
            end
        end
    end
    for _, w in ipairs(work) do
        if problem then
            break
        end
        if #w[2] > 0 then
            problem = bad(pending, "list") or bad(groups, "set")
        end
        for i, id in ipairs(w[2]) do
            if problem then
                break
            end
            local key = prefix .. id
            problem = bad(key, "hash")
            if not problem then
                local group = redis.call("HGET", key, "group")
                w[3][i] = group
                if group and group ~= "" then
                    problem = bad(gprefix .. group, "zset")
                end
            end
        end
    end
    if problem then
        problems[#problems + 1] = problem
    elseif #work[1][2] + #work[2][2] > 0 then
        local ordered = redis.pcall("GET", base .. "asyncq:ordered") == "1"
        for _, w in ipairs(work) do
            local source, ids = w[1], w[2]
            if #ids == limit then
                more = 1
            end
            for i, id in ipairs(ids) do
                local key = prefix .. id
                local group = w[3][i]
                if group and group ~= "" then
                    redis.call("ZADD", gprefix .. group, ARGV[1], id)
                    redis.call("ZREM", source, id)
                    redis.call("HSET", key, "state", "aggregating")
                    redis.call("SADD", groups, group)
                elseif redis.call("EXISTS", key) == 0 then
                    redis.call("ZREM", source, id)
                    redis.log(redis.LOG_WARNING, "asyncq: dropped id without task hash from " .. source .. ": " .. id)
                else
                    local push = "LPUSH"
                    if ordered and source == base .. "retry" then
                        push = "RPUSH"
                    end
                    if redis.call(push, pending, id) == 1 then
                        wake = true
                    end
                    redis.call("ZREM", source, id)
                    redis.call("HSET", key, "state", "pending", "pending_since", ARGV[2])
                end
            end
            moved = moved + #ids
        end
    end
    if not problem then
        for _, w in ipairs(work) do
            -- After the moves: the first id left is the next one due.
            local head = redis.call("ZRANGE", w[1], 0, 0, "WITHSCORES")
            if #head == 2 and (not earliest or tonumber(head[2]) < tonumber(earliest)) then
                earliest = head[2]
            end
        end
    end
    if wake then
        redis.pcall("PUBLISH", "asyncq:wakeup:{" .. name .. "}", name)
    end
end
local first = NAMES + 1
while first <= #ARGV do
    local last = math.min(#ARGV, first + CHUNK - 1)
    local sets = {}
    for q = first, last do
        sets[#sets + 1] = "asynq:{" .. ARGV[q] .. "}:scheduled"
        sets[#sets + 1] = "asynq:{" .. ARGV[q] .. "}:retry"
    end
    if redis.call("EXISTS", unpack(sets)) > 0 then
        for q = first, last do
            forward_queue(ARGV[q])
        end
    end
    first = last + 1
end
if #problems > 0 then
    return {moved, more, earliest or "", problems}
end
return {moved, more, earliest or ""}

-- include: guard, handoff, durable_step
-- Acknowledge many finished tasks of ONE queue in one call (asyncq's batched
-- asynq Done and MarkAsComplete): each task gets exactly the effect that
-- done.lua or mark_as_complete.lua would have, in the order given.
-- KEYS[1] active
-- KEYS[2] lease
-- KEYS[3] completed
-- KEYS[4] processed:<YYYY-MM-DD>
-- KEYS[5] processed (all-time)
-- ARGV[1] task key prefix   asynq:{<qname>}:t:
-- ARGV[2] queue key prefix  asynq:{<qname>}:
-- ARGV[3] expiry of the daily counter, unix seconds (now + 90 days)
-- ARGV[4] max int64, where the all-time counter wraps to 1
-- ARGV[5] one letter per task: d = Done, c = MarkAsComplete; upper case (D, C)
--         when the task has a unique key; w = Done, W = MarkAsComplete of a
--         workflow step (which has no unique key); r = Done, R = MarkAsComplete of
--         a durable run's step (no unique key either); h, H as r, R, and a run they
--         wake continues on this worker (record_step(), _lib/durable_step.lua); i, I as
--         r, R for a step run inline, in the slot of its run's attempt, which goes on
--         here (durable_inline.lua): its result comes with it, not from its task hash
-- ARGV[6..] per task, in order: id; the unique key (D, C); the workflow hash and
--           the "<stage>.<member>" place (w, W); the run's queue, the run's id and
--           the step's index (r, R, h, H, i, I); "=" and the result its handler wrote, or
--           "" when none (i, I); the completed score (now + retention) and the msg with
--           completed_at set (c, C, W, R, H, I). Done without a lock, the
--           common case, costs one argument.
-- ARGV[n-2] (only when h or H is among the tasks): the lease expiry (unix s) of a run
--           that continues on this worker.
-- ARGV[n-1], ARGV[n] (only when a workflow or durable step is among the tasks): now,
--           unix seconds and nanoseconds.
-- A workflow step is acknowledged as workflow_done.lua does it: its result (the
-- task hash's) is recorded in the workflow hash, and when it was its stage's last
-- member the next stage is enqueued (advance_ok(), workflow_advance.lua, prepended
-- when loaded). The steps of one workflow and stage in the batch are recorded
-- together, after the acknowledgements. A durable run's step is acknowledged as
-- durable_step_done.lua does it: its result is recorded in its run's record, which
-- goes to pending when it waits for nothing more (record_step(), _lib/durable_step.lua).
-- Its run's keys are built from the run's queue's name (give steps the run's queue on
-- a cluster, as docs/durable.md says).
-- Task hashes and unique locks are not in KEYS: they are built from (or checked
-- against) the queue's prefix, so they carry the queue's hash tag and live in
-- the same cluster slot as KEYS.
-- Returns one integer per task: 1 acknowledged, 0 NOT FOUND, -1 INTERNAL (the
-- completed set already held the id), -2 unique key outside the queue
-- (nothing touched); for a step of kind h or H whose run continues here, the run's
-- task message instead of 1; for a step of kind i or I, the result recorded in its
-- run (as stored) in place of 1 when this call recorded it (not when the outcome was
-- recorded before, the record is gone or a run waiting for it went to pending).
local tprefix, qprefix = ARGV[1], ARGV[2]
local plen = #qprefix
local out = {}
local n = 0
local kinds = ARGV[5]
local width = {
    d = 1, D = 2, c = 3, C = 4, w = 3, W = 5, r = 4, R = 6, h = 4, H = 6, i = 5, I = 7,
}
local need = 5
for k = 1, #kinds do
    local w = width[string.sub(kinds, k, k)]
    if not w then
        return redis.error_reply("ERR ack_many: unknown task kind in " .. kinds)
    end
    need = need + w
end
local here = nil  -- the lease expiry of a run that continues here
if string.find(kinds, "[wWrRhHiI]") then
    need = need + 2
end
if string.find(kinds, "[hH]") then
    need = need + 1
    here = ARGV[#ARGV - 2]
end
if need ~= #ARGV then
    return redis.error_reply("ERR ack_many: task kinds do not match the arguments")
end
-- asyncq: every key written below is checked before the first write (a key of
-- another type, a counter that is not an integer), so a failed call changes nothing.
local problem = bad(KEYS[2], "zset") or bad(KEYS[3], "zset") or bad(KEYS[4], "counter")
    or bad(KEYS[5], "counter")
local b = 6
-- KEYS[1] needs no check (the first LREM fails on another type before any write) and
-- KEYS[2] is checked above: a step's run in this queue leaves both unchecked again
local checked = {[KEYS[1]] = true, [KEYS[2]] = true}
for k = 1, #kinds do
    if problem then
        break
    end
    local kind = string.sub(kinds, k, k)
    local id = ARGV[b]
    b = b + 1
    if kind == "D" or kind == "C" then
        -- a lock outside the queue is refused per task (-2) before it is read
        if string.sub(ARGV[b], 1, plen) == qprefix then
            problem = bad(ARGV[b], "string")
        end
        b = b + 1
    elseif kind == "w" or kind == "W" then
        if not string.match(ARGV[b + 1], "^%d+%.%d+$") then
            problem = "ERR ack_many: bad workflow step place " .. ARGV[b + 1]
        elseif not checked[ARGV[b]] then
            checked[ARGV[b]] = true
            problem = bad(ARGV[b], "hash")
        end
        b = b + 2
    elseif string.find("rRhHiI", kind, 1, true) then
        if not string.match(ARGV[b + 2], "^%d+$") then
            problem = "ERR ack_many: bad durable step index " .. ARGV[b + 2]
        else
            -- the step's hash (read), its run's record and the run's keys it may move
            local rq = "asynq:{" .. ARGV[b] .. "}:"
            local checks = {
                {tprefix .. id, "hash"}, {rq .. "asyncq:run:" .. ARGV[b + 1], "hash"},
                {rq .. "t:" .. ARGV[b + 1], "hash"}, {rq .. "scheduled", "zset"},
                {rq .. "pending", "list"},
            }
            if kind == "h" or kind == "H" then
                checks[6] = {rq .. "active", "list"}
                checks[7] = {rq .. "lease", "zset"}
            end
            for _, check in ipairs(checks) do
                if not problem and not checked[check[1]] then
                    checked[check[1]] = true
                    problem = bad(check[1], check[2])
                end
            end
        end
        b = b + ((kind == "i" or kind == "I") and 4 or 3)
    end
    if kind == "c" or kind == "C" or kind == "W" then
        problem = problem or bad(tprefix .. id, "hash")
        b = b + 2
    elseif kind == "R" or kind == "H" or kind == "I" then
        b = b + 2
    end
end
if problem then
    return redis.error_reply(problem)
end
local a = 6
-- the workflow steps acknowledged, by workflow hash and stage, in first-seen order
local stages, order = {}, {}
for k = 1, #kinds do
    local kind = string.sub(kinds, k, k)
    local id = ARGV[a]
    a = a + 1
    local ukey, score, msg, wf, place, step = "", nil, nil, nil, nil, nil
    if kind == "D" or kind == "C" then
        ukey = ARGV[a]
        a = a + 1
    elseif kind == "w" or kind == "W" then
        wf, place = ARGV[a], ARGV[a + 1]
        a = a + 2
    elseif string.find("rRhHiI", kind, 1, true) then
        step = {q = ARGV[a], id = ARGV[a + 1], index = ARGV[a + 2]}
        a = a + 3
        if kind == "i" or kind == "I" then
            step.held = ARGV[a]
            a = a + 1
        end
    end
    local complete = string.find("cCWRHI", kind, 1, true) ~= nil
    if complete then
        score, msg = ARGV[a], ARGV[a + 1]
        a = a + 2
    end
    local res
    if ukey ~= "" and string.sub(ukey, 1, plen) ~= qprefix then
        res = -2
    elseif redis.call("LREM", KEYS[1], 0, id) == 0 then
        res = 0
    elseif redis.call("ZREM", KEYS[2], id) == 0 then
        res = 0
    elseif step then
        -- as durable_step_done.lua: the result read before the task hash goes, the
        -- outcome recorded whatever the acknowledgement's ZADD says; an inline step's
        -- result comes with it
        local result
        if step.held then
            result = #step.held > 0 and string.sub(step.held, 2)
        else
            result = redis.call("HGET", tprefix .. id, "result")
        end
        if complete then
            redis.call("ZADD", KEYS[3], score, id)
            if step.held and result then
                redis.call("HSET", tprefix .. id, "msg", msg, "state", "completed", "result", result)
            else
                redis.call("HSET", tprefix .. id, "msg", msg, "state", "completed")
            end
        else
            redis.call("DEL", tprefix .. id)
        end
        res = 1
        local rq = "asynq:{" .. step.q .. "}:"
        local continues = kind == "h" or kind == "H"
        -- a step that wrote no result (a Go handler, a task without retention) returned null
        local value = result or "null"
        local got, run_msg = record_step(rq .. "asyncq:run:" .. step.id, step.index, "r",
            value, {
                id = step.id, scheduled = rq .. "scheduled", pending = rq .. "pending",
                task = rq .. "t:" .. step.id, channel = "asyncq:wakeup:{" .. step.q .. "}",
                name = step.q, now = ARGV[#ARGV], here = continues and here or nil,
                inline = kind == "i" or kind == "I",
            })
        if got == "here" then
            res = run_msg  -- in place of 1: the step is acknowledged, its run continues here
        elseif kind == "i" or kind == "I" then
            res = got == "recorded" and value or 1  -- the run's attempt goes on with value
        end
    elseif wf then
        -- as workflow_done.lua: the result is read before the task hash goes (a key of
        -- another type has none), and a completed step is recorded whatever ZADD says
        local result = redis.pcall("HGET", tprefix .. id, "result")
        if type(result) == "table" then
            result = false
        end
        res = 1
        if complete then
            redis.call("ZADD", KEYS[3], score, id)
            redis.call("HSET", tprefix .. id, "msg", msg, "state", "completed")
        elseif redis.call("DEL", tprefix .. id) == 0 then
            res = 0
        end
        if res == 1 then
            local stage, _, member = string.match(place, "^(%d+)(%.)(%d+)$")
            local at = wf .. " " .. stage
            local group = stages[at]
            if not group then
                group = {wf = wf, stage = stage, members = {}, results = {}}
                stages[at] = group
                order[#order + 1] = group
            end
            group.members[#group.members + 1] = member
            group.results[#group.members] = result
        end
    elseif not complete then
        if redis.call("DEL", tprefix .. id) == 0 then
            res = 0
        else
            res = 1
        end
    elseif redis.call("ZADD", KEYS[3], score, id) ~= 1 then
        res = -1
    else
        redis.call("HSET", tprefix .. id, "msg", msg, "state", "completed")
        res = 1
    end
    if res == 1 or type(res) == "string" then
        n = n + 1
        if ukey ~= "" and redis.call("GET", ukey) == id then
            redis.call("DEL", ukey)
        end
    end
    out[#out + 1] = res
end
if n > 0 then
    -- One INCRBY stands for n INCRs: one of them returned 1 (and set the
    -- expiry) exactly when the counter went from <= 0 to >= 1.
    local day = redis.call("INCRBY", KEYS[4], n)
    if day >= 1 and day - n < 1 then
        redis.call("EXPIREAT", KEYS[4], ARGV[3])
    end
    local total = redis.call("GET", KEYS[5])
    if total and #total >= 18 then
        -- Close to the max-int64 wrap (or odd): Lua numbers are doubles, so
        -- step one task at a time exactly as Done does.
        for _ = 1, n do
            if redis.call("GET", KEYS[5]) == ARGV[4] then
                redis.call("SET", KEYS[5], 1)
            else
                redis.call("INCR", KEYS[5])
            end
        end
    else
        redis.call("INCRBY", KEYS[5], n)
    end
end
for _, group in ipairs(order) do
    advance_ok(group.wf, group.stage, group.members, group.results, ARGV[#ARGV - 1], ARGV[#ARGV])
end
return out

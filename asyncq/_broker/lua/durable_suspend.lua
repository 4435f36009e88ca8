-- include: guard, handoff
-- asyncq durable functions: suspend a run's attempt, atomically: record what the replay
-- decided (signatures, deadlines, local results), enqueue the steps it asked for, and
-- move the run task from active to where it waits. A run that waits is a scheduled
-- task: score = when time alone resumes it (a sleep's end, a wait's timeout; far in
-- the future for steps and for a wait without timeout). A step's acknowledgement
-- (durable_step_done.lua) or a signal (durable_signal.lua) moves it to pending
-- earlier. When what it waits for is already there, it goes to pending at once.
-- KEYS[1] active   KEYS[2] lease   KEYS[3] run task key   KEYS[4] scheduled
-- KEYS[5] pending  KEYS[6] the run's record
-- KEYS[7], KEYS[8] (mode "signal"): the signal's waiting-runs set, its kept signal
-- ARGV[1] run id   ARGV[2] mode: steps | signal | sleep   ARGV[3] score (unix s)
-- ARGV[4] now (unix ns, pending_since)   ARGV[5] wake-up channel   ARGV[6] queue name
-- ARGV[7] F, then F field/value pairs written to the record unless already there
-- then W, then W step indices waited for (mode steps), or the one index (signal)
-- then S, then S steps to enqueue: queue, task id, index, msg
-- then (optional) a lease expiry (unix s): the first step, when this call enqueues it,
-- is written active and leased to the caller until then, as a fetch leaves a task, to
-- run in the slot the run leaves (unless its queue is paused, limited or ordered: those
-- give tasks only through a fetch)
-- Returns "parked", "ready" (went to pending) or "here": its first step is leased to
-- the caller (the run parked or, with nothing left to wait for, pending); "cancelled"
-- (nothing written) when the run was cancelled while the attempt ran.
local run = KEYS[6]
-- KEYS[1] needs no check: LREM, the first write, fails on another type before any write
local problem = bad(KEYS[2], "zset") or bad(KEYS[3], "hash")
    or bad(KEYS[4], "zset") or bad(KEYS[5], "list") or bad(run, "hash")
local checked = {[KEYS[1]] = true, [KEYS[2]] = true, [KEYS[5]] = true}
local mode = ARGV[2]
if mode == "signal" then
    problem = problem or bad(KEYS[7], "set") or bad(KEYS[8], "string")
end
local a = 7
local records = {}
for _ = 1, tonumber(ARGV[a]) do
    records[#records + 1] = {ARGV[a + 1], ARGV[a + 2]}
    a = a + 2
end
a = a + 1
local waits = {}
for _ = 1, tonumber(ARGV[a]) do
    waits[#waits + 1] = ARGV[a + 1]
    a = a + 1
end
a = a + 1
local steps = {}
for _ = 1, tonumber(ARGV[a]) do
    local q, id = ARGV[a + 1], ARGV[a + 2]
    local step = {q = q, id = id, index = ARGV[a + 3], msg = ARGV[a + 4]}
    steps[#steps + 1] = step
    local pending = "asynq:{" .. q .. "}:pending"
    if not problem then
        -- whether the step's task is there already (enqueued by an earlier attempt)
        problem, step.there = typed("asynq:{" .. q .. "}:t:" .. id, "hash")
    end
    if not checked[pending] then
        checked[pending] = true
        problem = problem or bad(pending, "list")
    end
    a = a + 4
end
local here = ARGV[a + 1]
local first = steps[1]
if here and first then
    -- the first step may run here: its queue's active list and lease are written then
    local base = "asynq:{" .. first.q .. "}:"
    first.base = base
    for _, check in ipairs({{base .. "active", "list"}, {base .. "lease", "zset"}}) do
        if not checked[check[1]] then
            checked[check[1]] = true
            problem = problem or bad(check[1], check[2])
        end
    end
end
if problem then
    return redis.error_reply(problem)
end
-- whether each entry asked for (its steps, what it waits for) is recorded (a result
-- or a failure), what an earlier suspension waited for and the run's state: read in
-- one HMGET (in slices of 500 entries for a large gather), before any write
local asked, seen, listed = {}, {}, {}
local function ask(i)
    if not listed[i] then  -- an entry both enqueued and waited for is read once
        listed[i] = true
        asked[#asked + 1] = i
    end
end
for _, s in ipairs(steps) do
    ask(s.index)
end
for _, i in ipairs(waits) do
    ask(i)
end
local old, state
for first = 1, math.max(#asked, 1), 500 do
    local fields = first == 1 and {"wait", "state"} or {}
    for n = first, math.min(first + 499, #asked) do
        fields[#fields + 1] = "r:" .. asked[n]
        fields[#fields + 1] = "e:" .. asked[n]
    end
    local got = redis.call("HMGET", run, unpack(fields))
    local at = 1
    if first == 1 then
        old, state, at = got[1], got[2], 3
    end
    for n = first, math.min(first + 499, #asked) do
        seen[asked[n]] = (got[at] or got[at + 1]) and true or false
        at = at + 2
    end
end
if state == "cancelled" then
    -- cancelled while this attempt ran (durable_cancel.lua), before the stop reached it:
    -- nothing is written, the caller archives the run as the stop would have
    return "cancelled"
end
if redis.call("LREM", KEYS[1], 0, ARGV[1]) == 0 then
    return redis.error_reply("NOT FOUND")
end
redis.call("ZREM", KEYS[2], ARGV[1])
for _, r in ipairs(records) do
    redis.call("HSETNX", run, r[1], r[2])
end
-- A run that waits keeps its record for good. Only a record that is not running or
-- waiting can have an expiry: a run's first attempt (durable_start.lua gave its record
-- one), a run cancelled while its attempt ran, an ended run run again by hand.
if state ~= "running" and state ~= "waiting" then
    redis.call("PERSIST", run)
end
-- what an earlier suspension waited for is replaced by what this one waits for
if old then
    for i in string.gmatch(old, "%d+") do
        redis.call("HDEL", run, "w:" .. i)
    end
    redis.call("HDEL", run, "wait", "missing")
end
local pushed, made = {}, {}
local leased = false  -- the first step went active, leased to the caller
for _, s in ipairs(steps) do
    local tkey = "asynq:{" .. s.q .. "}:t:" .. s.id
    -- a step recorded or already enqueued (by an attempt that crashed after this
    -- script, or earlier in this one: a step asked for twice) is not enqueued again:
    -- its task id is derived from the run's
    if not seen[s.index] and not s.there and not made[tkey] then
        made[tkey] = true
        if s.base and may_hand_on(s.base) then
            redis.call("HSET", tkey, "msg", s.msg, "state", "active")
            lease_to_caller(s.base, s.id, here)
            leased = true
        else
            redis.call("HSET", tkey, "msg", s.msg, "state", "pending", "pending_since", ARGV[4])
            redis.call("LPUSH", "asynq:{" .. s.q .. "}:pending", s.id)
            pushed[s.q] = true
        end
    end
end
for q in pairs(pushed) do
    redis.pcall("PUBLISH", "asyncq:wakeup:{" .. q .. "}", q)
end
local ready = false
local wait_fields = {}
if mode == "steps" then
    local missing, fields, counted = {}, {}, {}
    for _, i in ipairs(waits) do
        if not seen[i] and not counted[i] then  -- a step awaited twice is one to wait for
            counted[i] = true
            missing[#missing + 1] = i
            fields[#fields + 1] = "w:" .. i
            fields[#fields + 1] = "1"
        end
    end
    if #missing == 0 then
        ready = true
    else
        -- with the parked run's state and until below: one HSET for all
        wait_fields = fields
        fields[#fields + 1] = "wait"
        fields[#fields + 1] = table.concat(missing, ",")
        fields[#fields + 1] = "missing"
        fields[#fields + 1] = #missing
    end
elseif mode == "signal" then
    local i = waits[1]
    if seen[i] then
        ready = true
    else
        local kept = redis.call("GET", KEYS[8])
        if kept then
            -- the signal came before its wait: it is this wait's payload
            redis.call("HSET", run, "r:" .. i, kept)
            redis.call("DEL", KEYS[8])
            redis.call("SREM", KEYS[7], ARGV[1] .. " " .. i)
            ready = true
        else
            redis.call("SADD", KEYS[7], ARGV[1] .. " " .. i)
        end
    end
end
if ready then
    redis.call("HSET", KEYS[3], "state", "pending", "pending_since", ARGV[4])
    redis.call("LPUSH", KEYS[5], ARGV[1])
    redis.call("HSET", run, "state", "running")
    redis.call("HDEL", run, "until")
    redis.pcall("PUBLISH", ARGV[5], ARGV[6])
    return leased and "here" or "ready"
end
redis.call("ZADD", KEYS[4], ARGV[3], ARGV[1])
redis.call("HSET", KEYS[3], "state", "scheduled")  -- an active task has no pending_since
wait_fields[#wait_fields + 1] = "state"
wait_fields[#wait_fields + 1] = "waiting"
wait_fields[#wait_fields + 1] = "until"
wait_fields[#wait_fields + 1] = ARGV[3]
-- in slices: unpack() takes a few thousand values at most (a gather may wait for more)
for f = 1, #wait_fields, 1000 do
    redis.call("HSET", run, unpack(wait_fields, f, math.min(f + 999, #wait_fields)))
end
return leased and "here" or "parked"

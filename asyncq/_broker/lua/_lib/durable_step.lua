-- _lib/durable_step.lua (after handoff): record_step(...), recording a finished step of
-- a durable run in the run's record and making the run runnable again when it was the
-- last step the run waits for; written once for the step's own acknowledgement
-- (durable_step_done.lua) and the batched acknowledgement of successes (ack_many.lua).
-- record_step(run, i, field, value, q): run the record's key, i the step's index, field
-- "r" (a result) or "e" (a failure) and value what is recorded; q the run's queue: a
-- table of its keys {id = run id, scheduled, pending, task = the run task's key,
-- channel = wake-up channel, name, now = pending_since (unix ns)}, whose types the
-- caller checked (with q.here, its active list and lease too); with q.here (a lease
-- expiry, unix s) a run woken continues on the acknowledging worker (active, leased
-- until q.here, as a fetch leaves it) when its queue may hand it on (may_hand_on(),
-- _lib/handoff.lua). With q.inline (a step run inline, durable_inline.lua, which wrote
-- the record's state) a record without a state is taken as none. Returns "woken",
-- "recorded", "seen" (recorded before) or "gone" (no record); a run that continues
-- here: "here" and its task message.
local function record_step(run, i, field, value, q)
    local got
    if q.inline then
        got = redis.call("HMGET", run, "r:" .. i, "e:" .. i, "w:" .. i, "missing", "state")
        if not got[5] then
            return "gone"
        end
    elseif redis.call("EXISTS", run) == 0 then
        return "gone"
    else
        got = redis.call("HMGET", run, "r:" .. i, "e:" .. i, "w:" .. i, "missing")
    end
    if got[1] or got[2] then
        return "seen"
    end
    local entry = field .. ":" .. i
    if not got[3] then
        redis.call("HSET", run, entry, value)
        return "recorded"
    end
    local missing = (tonumber(got[4]) or 1) - 1
    if missing > 0 then
        redis.call("HSET", run, entry, value, "missing", missing)
        redis.call("HDEL", run, "w:" .. i)
        return "recorded"
    end
    -- The run waits for nothing more: parked in the scheduled set, it becomes pending.
    -- Not parked (it is running or retrying), it reads this record when it replays.
    redis.call("HDEL", run, "w:" .. i, "missing", "wait")
    if redis.call("ZREM", q.scheduled, q.id) == 0 then
        redis.call("HSET", run, entry, value)
        return "recorded"
    end
    redis.call("HSET", run, entry, value, "state", "running")
    local base = string.sub(q.pending, 1, -8)  -- "asynq:{<queue>}:"
    if q.here and may_hand_on(base) then
        local msg = redis.call("HGET", q.task, "msg")
        if msg then
            lease_to_caller(base, q.id, q.here)
            redis.call("HSET", q.task, "state", "active")
            return "here", msg
        end
    end
    redis.call("HSET", q.task, "state", "pending", "pending_since", q.now)
    redis.call("LPUSH", q.pending, q.id)
    redis.pcall("PUBLISH", q.channel, q.name)
    return "woken"
end

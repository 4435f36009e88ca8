-- include: guard, handoff
-- asyncq durable functions: runs' attempts go on while the one step each awaits runs on
-- the caller, in the run's slot (inline steps, asyncq/_worker/attempt.py), for the runs
-- of ONE queue whose attempts asked in the same event-loop turn. For each: the
-- attempt's records are written (each unless already there) and its step's task is
-- written active and leased to the caller until ARGV[2], as a fetch leaves a task. The
-- run task stays active and leased: nothing of it moves, and its record says it is
-- running. A step runs in its run's queue (its keys are the run's, one hash slot).
-- KEYS[1] active   KEYS[2] lease   (of the queue)
-- ARGV[1] the queue's key prefix "asynq:{<queue>}:"   ARGV[2] lease expiry (unix s)
-- then per step: the run's id, the step's index, the step's id, the step's msg, F, then
-- F field/value pairs for the run's record
-- Returns one answer per step: "here", the step is the caller's to run. Otherwise nothing
-- is written for it, and the caller suspends its attempt instead (durable_suspend.lua):
-- "seen" (the step's outcome is recorded), "there" (its task exists: enqueued by an
-- earlier attempt), "fetch" (the queue gives tasks only through a fetch: paused, limited
-- or ordered), "waiting" (the record holds an earlier suspension's wait, which only a
-- suspension replaces), "cancelled" (the run was cancelled while its attempt ran), or
-- the error reading its record ("WRONGTYPE ..."). A damaged active list or lease fails
-- the call, writing nothing.
local base, expiry = ARGV[1], ARGV[2]
local problem = bad(KEYS[1], "list") or bad(KEYS[2], "zset")
if problem then
    return redis.error_reply(problem)
end
local open = may_hand_on(base)
local out = {}
local a = 3
while a <= #ARGV do
    local run_id, index, step_id, msg = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
    local first, last = a + 5, a + 4 + 2 * tonumber(ARGV[a + 4])
    a = last + 1
    local run, tkey = base .. "asyncq:run:" .. run_id, base .. "t:" .. step_id
    -- a record of another type fails this read: this step's answer, before any write
    local got = redis.pcall("HMGET", run, "state", "r:" .. index, "e:" .. index)
    local answer
    if got.err then
        answer = got.err
    elseif got[1] == "cancelled" then
        answer = "cancelled"
    elseif got[2] or got[3] then
        answer = "seen"
    elseif got[1] and got[1] ~= "pending" and got[1] ~= "running" then
        answer = "waiting"
    elseif redis.call("EXISTS", tkey) == 1 then
        answer = "there"
    elseif not open then
        answer = "fetch"
    else
        answer = "here"
        lease_to_caller(base, step_id, expiry)
        redis.call("HSET", tkey, "msg", msg, "state", "active")
        for f = first, last, 2 do
            redis.call("HSETNX", run, ARGV[f], ARGV[f + 1])
        end
        if got[1] ~= "running" then
            -- a first attempt's record (durable_start.lua gave it an expiry), or none yet
            -- (a run enqueued by another client): a running run's record is kept for good
            redis.call("HSET", run, "state", "running")
            redis.call("PERSIST", run)
        end
    end
    out[#out + 1] = answer
end
return out

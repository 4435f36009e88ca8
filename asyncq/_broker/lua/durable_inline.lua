-- include: guard, handoff
-- asyncq durable functions: a run's attempt goes on while its one step runs on the
-- caller, in the run's slot (an inline step, asyncq/_worker/attempt.py): the attempt's
-- records are written (each unless already there) and the step's task is written
-- active and leased to the caller until ARGV[4], as a fetch leaves a task. The run task
-- stays active and leased: nothing of it moves, and its record says it is running. The
-- step runs in the run's queue (its keys are the run's, one hash slot).
-- KEYS[1] the run's record   KEYS[2] the step's task key
-- KEYS[3] active   KEYS[4] lease   (of the run's queue)
-- ARGV[1] the step's index   ARGV[2] the step's id   ARGV[3] the step's msg
-- ARGV[4] lease expiry (unix s)   ARGV[5] F, then F field/value pairs for the record
-- Returns "here": the step is the caller's to run. Otherwise nothing is written, and the
-- caller suspends the attempt instead (durable_suspend.lua): "seen" (the step's outcome
-- is recorded), "there" (its task exists: enqueued by an earlier attempt), "fetch" (the
-- queue gives tasks only through a fetch: paused, limited or ordered), "waiting" (the
-- record holds an earlier suspension's wait, which only a suspension replaces),
-- "cancelled" (the run was cancelled while this attempt ran).
local run, tkey = KEYS[1], KEYS[2]
-- a record of another type fails this read, before any write
local got = redis.call("HMGET", run, "state", "r:" .. ARGV[1], "e:" .. ARGV[1])
local state = got[1]
if state == "cancelled" then
    return "cancelled"
end
if got[2] or got[3] then
    return "seen"
end
if state and state ~= "pending" and state ~= "running" then
    return "waiting"
end
if redis.call("EXISTS", tkey) == 1 then
    return "there"
end
local base = string.sub(KEYS[3], 1, -7)  -- "asynq:{<queue>}:"
if not may_hand_on(base) then
    return "fetch"
end
-- KEYS[3] needs no check: LPUSH, the first write, fails on another type before any write
local problem = bad(KEYS[4], "zset")
if problem then
    return redis.error_reply(problem)
end
lease_to_caller(base, ARGV[2], ARGV[4])
redis.call("HSET", tkey, "msg", ARGV[3], "state", "active")
for a = 6, 5 + 2 * tonumber(ARGV[5]), 2 do
    redis.call("HSETNX", run, ARGV[a], ARGV[a + 1])
end
if state ~= "running" then
    -- a first attempt's record (durable_start.lua gave it an expiry), or none yet (a run
    -- enqueued by another client): a running run's record is kept for good
    redis.call("HSET", run, "state", "running")
    redis.call("PERSIST", run)
end
return "here"

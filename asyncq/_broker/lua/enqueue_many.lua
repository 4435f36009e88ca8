-- include: guard
-- Enqueue many pending tasks of one queue in one call (asyncq's batch path). Each task
-- ends exactly as asynq's Enqueue leaves it: its hash (msg, state, pending_since) and
-- its id pushed onto the pending list, in argument order.
-- KEYS[1]      pending   asynq:{q}:pending
-- KEYS[2..n+1] task keys asynq:{q}:t:<id>, one per task
-- ARGV[1] now, unix nanoseconds (pending_since)
-- ARGV[2] asyncq: wake-up channel ("" for none), ARGV[3] the queue name, also the message published on it
-- ARGV[2+2i], ARGV[3+2i] (i = 1..n): task i's id and msg (TaskMessage bytes)
-- Returns one integer per task, in order: 1 written, 0 its task id already exists
-- (an earlier task of the same call with that id counts: the first one wins).
-- KEYS[n+2] asyncq (optional, not on Redis Cluster): asynq:queues, where the queue (ARGV[3])
-- is registered with the writes, so a queue removed under a long-lived client (`queue rm`,
-- FLUSHALL) is listed again by its next enqueue.
-- asyncq: nothing is written when the pending key (or asynq:queues) holds another type.
local tasks = (#ARGV - 3) / 2
local registry = KEYS[tasks + 2]
local problem = bad(KEYS[1], "list") or (registry and bad(registry, "set"))
if problem then
    return redis.error_reply(problem)
end
local out, ids, n = {}, {}, 0
for i = 2, tasks + 1 do
    local a = 2 * i
    if redis.call("EXISTS", KEYS[i]) == 1 then
        out[i - 1] = 0
    else
        redis.call("HSET", KEYS[i], "msg", ARGV[a + 1], "state", "pending", "pending_since", ARGV[1])
        n = n + 1
        ids[n] = ARGV[a]
        out[i - 1] = 1
    end
end
if n > 0 and redis.call("LPUSH", KEYS[1], unpack(ids)) == n and ARGV[2] ~= "" then
    redis.pcall("PUBLISH", ARGV[2], ARGV[3])
end
if n > 0 and registry then
    redis.call("SADD", registry, ARGV[3])
end
return out

-- Enqueue a pending task (asynq Enqueue), or deliver it to an idle asyncq worker.
-- KEYS[1] task key  asynq:{q}:t:<id>
-- KEYS[2] pending   asynq:{q}:pending
-- ARGV[1] msg (TaskMessage bytes)
-- ARGV[2] task id
-- ARGV[3] now, unix nanoseconds (pending_since)
-- ARGV[4] asyncq: wake-up channel (optional), ARGV[5] message published on it
-- Returns 1 when written, 0 when the task id already exists.
-- asyncq: nothing is written when a destination key holds another type, so a failed
-- call never leaves a task hash without its list entry: the LPUSH goes first (a
-- WRONGTYPE there stops the script before any write), and the HSET after it cannot
-- fail, the task key being known not to exist. A script runs atomically, so no
-- reader sees the id before its hash.
-- The wake-up is an optimisation: redis.pcall, so that a user whose ACL forbids the
-- channel still gets the write (an error here would come after the write).
-- KEYS[3] asyncq (optional, not on Redis Cluster): asynq:queues, and ARGV[6] the queue name:
-- the queue is registered with the write, so a queue removed under a long-lived client
-- (`queue rm`, FLUSHALL) is listed again by its next enqueue.
-- KEYS[4] asyncq (optional, with KEYS[3]): asynq:{q}:asyncq:waiters, the idle asyncq
-- workers waiting for this queue (members "<lease seconds>:<delivery key>", see
-- delivery_arm.lua). When the queue has no pending task, is neither paused nor limited,
-- and a waiting worker still has credit, the task skips pending: it is written active
-- with that worker's lease, exactly as a dequeue leaves it (state=active, in active,
-- leased in lease), and published on the worker's delivery channel, so it starts
-- without a fetch. It is delivered only when the PUBLISH reached the worker: a gone
-- worker receives nothing, and the task is written pending instead. A worker that
-- received it and then died leaves a lease that expires like any other.
local registry = KEYS[3]
if registry and not ({none=true, set=true})[redis.call("TYPE", registry).ok] then
    return redis.error_reply("WRONGTYPE " .. registry .. " is not a set")
end
if redis.call("EXISTS", KEYS[1]) == 1 then
    return 0
end

local DELIVERY = "asyncq:delivery:"
local TRIES = 4 -- waiters looked at per enqueue: a list of departed workers costs little

local function deliver(waiters, base)
    local n = redis.pcall("LLEN", waiters)
    if type(n) ~= "number" or n == 0 or redis.call("LLEN", KEYS[2]) > 0 then
        return false -- no waiter, or tasks wait already (they go first)
    end
    if redis.call("EXISTS", base .. "paused", base .. "asyncq:limit", base .. "asyncq:rate") > 0
        or redis.pcall("GET", base .. "asyncq:ordered") == "1" then
        return false -- the dequeue script decides for paused, limited and ordered queues
    end
    local active, lease = base .. "active", base .. "lease"
    if not ({none=true, list=true})[redis.call("TYPE", active).ok]
        or not ({none=true, zset=true})[redis.call("TYPE", lease).ok] then
        return false
    end
    for _ = 1, math.min(n, TRIES) do
        -- The tail goes to the head: successive enqueues visit the waiters in turn.
        local token = redis.call("RPOPLPUSH", waiters, waiters)
        if not token then
            return false -- emptied by the LREMs below (a member written twice by hand)
        end
        local sep = string.find(token, ":", 1, true)
        local secs = sep and tonumber(string.sub(token, 1, sep - 1))
        local key = sep and string.sub(token, sep + 1)
        local credit = false
        if secs and key and string.sub(key, 1, #DELIVERY) == DELIVERY then
            credit = redis.pcall("GET", key)
        end
        if credit == false then
            -- Not a member a worker wrote, or its credit expired: a departed worker
            -- (a live one that waits again writes itself back).
            redis.call("LREM", waiters, 0, token)
        elseif (tonumber(credit) or 0) > 0 then
            local now = redis.call("TIME")
            local expiry = tonumber(now[1]) + secs
            local queue, id = ARGV[6], ARGV[2]
            local note = string.format("%d %d %d ", expiry, #queue, #id) .. queue .. id .. ARGV[1]
            if redis.call("PUBLISH", key, note) > 0 then
                redis.call("DECR", key)
                redis.call("LPUSH", active, id)
                redis.call("HSET", KEYS[1], "msg", ARGV[1], "state", "active")
                redis.call("ZADD", lease, expiry, id)
                return true
            end
            redis.call("DEL", key) -- nobody listens: the worker is gone
        end
    end
    return false
end

if KEYS[4] and deliver(KEYS[4], string.sub(KEYS[2], 1, -8)) then
    redis.call("SADD", registry, ARGV[6])
    return 1
end
local len = redis.call("LPUSH", KEYS[2], ARGV[2])
redis.call("HSET", KEYS[1], "msg", ARGV[1], "state", "pending", "pending_since", ARGV[3])
if len == 1 and ARGV[4] then
    redis.pcall("PUBLISH", ARGV[4], ARGV[5])
end
if registry then
    redis.call("SADD", registry, ARGV[6])
end
return 1

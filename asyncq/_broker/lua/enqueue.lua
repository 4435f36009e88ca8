-- include: guard, room
-- Enqueue a pending task (asynq Enqueue), or deliver it to an idle asyncq worker.
-- KEYS[1] task key  asynq:{q}:t:<id>
-- KEYS[2] pending   asynq:{q}:pending
-- ARGV[1] msg (TaskMessage bytes)
-- ARGV[2] task id
-- ARGV[3] now, unix nanoseconds (pending_since)
-- ARGV[4] asyncq: wake-up channel (optional), ARGV[5] message published on it
-- Returns 1 when written (or {1, member, ...}: see KEYS[4]), 0 when the task id already
-- exists.
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
-- delivery_arm.lua), and ARGV[7] now, unix seconds (the caller's clock). When the queue
-- has no pending task and may give one now (_lib/room.lua: the rule a fetch applies),
-- and a waiting worker still has credit, the task skips pending: it is written active
-- with that worker's lease, exactly as a dequeue leaves it (state=active, in active,
-- leased in lease), and published on the worker's delivery channel, so it starts
-- without a fetch.
-- The lease expires at ARGV[7] + the member's lease seconds: the caller's clock, as for
-- every lease (a fetch's comes from the worker's clock, ARGV of dequeue_queues.lua, and
-- the recoverer compares with its own), since asynq computes leases and recovery from
-- the calling process's clock (servers NTP-synced); Redis TIME here would be a second
-- clock for the same scores.
-- It is delivered only to a worker subscribed to its channel by name (PUBSUB NUMSUB): a
-- gone worker receives nothing, even while a client listens on a pattern (PUBLISH would
-- count that one), and the task is written pending instead. A worker that received it
-- and then died leaves a lease that expires like any other.
-- A member no worker wrote (no delivery key, lease seconds that are not a positive
-- integer of at most 15 digits, a credit that is no count or of another type) is
-- checked before anything is written, dropped from the list and named in the reply,
-- which is then {1, member, ...} instead of 1, so the client logs it; the task is
-- written all the same.
local registry = KEYS[3]
local problem = registry and bad(registry, "set")
if problem then
    return redis.error_reply(problem)
end
if redis.call("EXISTS", KEYS[1]) == 1 then
    return 0
end

local DELIVERY = "asyncq:delivery:"
local TRIES = 4 -- waiters looked at per enqueue: a list of departed workers costs little
local dropped = {}

-- The positive integer s holds, when it is one of at most digits digits; else nil
-- (tonumber would take "nan", "inf", "1e300", "0x10", "-100" and "2.5").
local function whole(s, digits)
    if type(s) == "string" and #s <= digits and string.match(s, "^[1-9]%d*$") then
        return tonumber(s)
    end
    return nil
end

local function deliver(waiters, base)
    local n = redis.pcall("LLEN", waiters)
    if type(n) ~= "number" or n == 0 or redis.call("LLEN", KEYS[2]) > 0 then
        return false -- no waiter, or tasks wait already (they go first)
    end
    -- As the waiting worker's own fetch would decide: the stored limit applies, and no
    -- rate (a worker with a rate or a configured limit for the queue does not wait for
    -- deliveries from it; taking a token here would spend another worker's rate).
    local now = tonumber(ARGV[7])
    local room, _, problem = queue_room(base, 1, now)
    if not room or room <= 0 or problem then
        return false -- paused, held, or a key of another type (the fetch reports it)
    end
    for _ = 1, math.min(n, TRIES) do
        -- The tail goes to the head: successive enqueues visit the waiters in turn.
        local token = redis.call("RPOPLPUSH", waiters, waiters)
        if not token then
            return false -- emptied by the LREMs below (a member written twice by hand)
        end
        local sep = string.find(token, ":", 1, true)
        local secs = sep and whole(string.sub(token, 1, sep - 1), 15)
        local key = sep and string.sub(token, sep + 1)
        local credit = nil
        if secs and string.sub(key, 1, #DELIVERY) == DELIVERY then
            credit = redis.pcall("GET", key)
        end
        -- A count DECR takes: "0", or no leading zero ("01" would fail it after the PUBLISH).
        local count = type(credit) == "string" and (credit == "0" and 0 or whole(credit, 18))
        if credit == false then
            -- Its credit expired: a departed worker (a live one that waits again writes
            -- itself back).
            redis.call("LREM", waiters, 0, token)
        elseif not count then
            redis.call("LREM", waiters, 0, token)
            dropped[#dropped + 1] = token
        elseif count > 0 then
            -- Subscribers by name only: PUBLISH's count includes pattern subscribers.
            local channel = redis.pcall("PUBSUB", "NUMSUB", key)
            if channel.err then
                return false -- a user whose ACL forbids it: the task waits in pending
            end
            if channel[2] > 0 then
                local expiry = now + secs
                local queue, id = ARGV[6], ARGV[2]
                local note = string.format("%d %d %d ", expiry, #queue, #id) .. queue .. id .. ARGV[1]
                if type(redis.pcall("PUBLISH", key, note)) ~= "number" then
                    return false -- the ACL forbids the channel: as above
                end
                -- Nothing below can fail: every key was checked (queue_room, the credit).
                redis.call("DECR", key)
                redis.call("LPUSH", base .. "active", id)
                redis.call("HSET", KEYS[1], "msg", ARGV[1], "state", "active")
                redis.call("ZADD", base .. "lease", expiry, id)
                return true
            end
            redis.call("DEL", key) -- nobody listens: the worker is gone
        end
    end
    return false
end

local function reply()
    if #dropped == 0 then
        return 1
    end
    return {1, unpack(dropped)}
end

if KEYS[4] and deliver(KEYS[4], string.sub(KEYS[2], 1, -8)) then
    redis.call("SADD", registry, ARGV[6])
    return reply()
end
local len = redis.call("LPUSH", KEYS[2], ARGV[2])
redis.call("HSET", KEYS[1], "msg", ARGV[1], "state", "pending", "pending_since", ARGV[3])
if len == 1 and ARGV[4] then
    redis.pcall("PUBLISH", ARGV[4], ARGV[5])
end
if registry then
    redis.call("SADD", registry, ARGV[6])
end
return reply()

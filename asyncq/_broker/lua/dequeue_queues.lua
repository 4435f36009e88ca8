-- include: guard, room
-- Take up to ARGV[2] tasks from many queues in one call, trying them in order
-- (asyncq; each task moves exactly as asynq's Dequeue moves it, same keys).
-- ARGV[1] lease expiry, unix seconds
-- ARGV[2] maximum number of tasks to take
-- ARGV[3] byte budget: stop before a task whose msg would take the bytes taken
--         past it; -1 = no budget
-- ARGV[4] 1 = the first task taken may exceed the budget (nothing else in flight)
-- ARGV[5] queues per EXISTS probe (1 on a cluster: one command cannot span slots)
-- ARGV[6] now, unix seconds (asyncq flow control: live leases have score >= it)
-- ARGV[7] concurrency limits: "pos:fleet:local;..." for the queues (1-based
--         positions in ARGV[8..]) with a configured limit; -1 = none. fleet is
--         the server's queue_concurrency (a stored asynq:{q}:asyncq:limit
--         overrides it), local the room left under the server-local limit.
--         An entry may add ":interval:burst" (asyncq rate limit): a GCRA token
--         bucket that gives one task every interval microseconds and holds at
--         most burst; its state is the hash asynq:{q}:asyncq:rate (tat: the
--         theoretical arrival time, microseconds of Redis TIME; interval and
--         burst: the rate that wrote it, for the Inspector), shared by every worker.
-- ARGV[8..] queue names, in the order to try them
-- The keys are built from the names (asynq:{<q>}:pending, :paused, :active,
-- :lease, :t:<id>): passing names instead of four keys per queue keeps a call
-- over thousands of queues small. On a cluster every queue of one call is on
-- the node the call goes to (see multiqueue.py).
-- Each task moves from the tail of pending to the head of active, gets
-- state=active, loses pending_since and is leased until ARGV[1]. The queues
-- are looked at ARGV[5] at a time: one EXISTS over their pending lists skips a
-- chunk of empty queues; in a chunk with work an empty queue costs one LLEN, a
-- non-empty paused one an EXISTS more.
-- Flow control: for a queue with work, the fleet-wide limit is the stored
-- asynq:{q}:asyncq:limit if set, else the configured one; only live leases
-- (ZCOUNT lease now +inf) count against it, so a dead worker's expired leases
-- hold nothing. A queue takes at most min(limit - live leases, local room).
-- Ordered queues (asynq:{q}:asyncq:ordered = "1") take at most one task, and
-- only while the queue's active list and retry set are empty.
-- Returns {empty, taken, full, held}: empty lists the 1-based positions (in ARGV[8..])
-- of the queues found empty or paused (those looked at, drained ones included);
-- taken is a flat array position, id, msg, ...; full is 1 when the byte budget
-- stopped the call; held lists the positions of the queues with work that a
-- limit or rate kept from giving any (more) task. An id whose hash is gone is taken out
-- of active again and returned with msg false, so the caller can log it.
local want = tonumber(ARGV[2])
local budget = tonumber(ARGV[3])
local first_free = ARGV[4] == "1"
local NAMES = 7
local nqueues = #ARGV - NAMES
local CHUNK = tonumber(ARGV[5])
local now = tonumber(ARGV[6])
local fleet_cfg = {}
local local_room = {}
local rate_iv = {}
local rate_burst = {}
for entry in string.gmatch(ARGV[7], "[^;]+") do
    local f = {}
    for part in string.gmatch(entry, "[^:]+") do
        f[#f + 1] = tonumber(part)
    end
    if f[1] then
        fleet_cfg[f[1]] = f[2]
        local_room[f[1]] = f[3]
        if f[4] and f[5] then
            rate_iv[f[1]] = f[4]
            rate_burst[f[1]] = f[5]
        end
    end
end
local held = {}
local bytes = 0
local got = 0
local empty = {}
local taken = {}
local full = false
local done = false
local first = 1
while first <= nqueues and not done do
    local last = math.min(nqueues, first + CHUNK - 1)
    local pendings = {}
    for q = first, last do
        pendings[#pendings + 1] = "asynq:{" .. ARGV[NAMES + q] .. "}:pending"
    end
    -- One EXISTS over the chunk: empty lists do not exist, so an idle chunk costs
    -- one native command instead of an LLEN per queue.
    if redis.call("EXISTS", unpack(pendings)) == 0 then
        for q = first, last do
            empty[#empty + 1] = q
        end
    else
        for q = first, last do
            local base = "asynq:{" .. ARGV[NAMES + q] .. "}:"
            local pending = pendings[q - first + 1]
            local active = base .. "active"
            local prefix = base .. "t:"
            local lease = base .. "lease"
            local room = want - got
            local tat = nil
            local stopped = false
            local problem = nil
            if redis.call("LLEN", pending) == 0 then
                empty[#empty + 1] = q
                stopped = true
            else
                -- asyncq: nothing is written for a queue with a key of another type (see
                -- queue_room), and an id is moved only once its hash is read, so a failure
                -- never leaves an id in active without its lease or state. It is an
                -- error when nothing was taken yet, else the fetch stops.
                room, tat, problem = queue_room(base, room, now, fleet_cfg[q], local_room[q],
                    rate_iv[q], rate_burst[q])
                if not room then -- paused
                    empty[#empty + 1] = q
                    stopped = true
                elseif room <= 0 and not problem then
                    held[#held + 1] = q
                    stopped = true
                end
            end
            if not stopped then
                local here = 0
                while got < want and here < room and not problem do
                    local id = redis.call("LINDEX", pending, -1)
                    if not id then
                        empty[#empty + 1] = q
                        break
                    end
                    local key = prefix .. id
                    local msg = redis.pcall("HGET", key, "msg")
                    if type(msg) == "table" and msg.err then
                        problem = msg.err
                        break
                    end
                    if msg and budget >= 0 then
                        if bytes + #msg > budget and not (got == 0 and first_free) then
                            -- Over the byte budget: the id stays at the tail of pending.
                            full = true
                            break
                        end
                        bytes = bytes + #msg
                    end
                    redis.call("RPOPLPUSH", pending, active)
                    if msg then
                        redis.call("HSET", key, "state", "active")
                        redis.call("HDEL", key, "pending_since")
                        redis.call("ZADD", lease, ARGV[1], id)
                        got = got + 1
                        here = here + 1
                    else
                        redis.call("LREM", active, 1, id)
                    end
                    taken[#taken + 1] = q
                    taken[#taken + 1] = id
                    taken[#taken + 1] = msg
                end
                if tat and here > 0 then
                    local rate_key = base .. "asyncq:rate"
                    local new = tat + here * rate_iv[q]
                    -- Numbers written as text: Redis 7.2 would store 900000000 as "9e+8".
                    redis.call("HSET", rate_key, "tat", string.format("%.0f", new),
                        "interval", string.format("%.0f", rate_iv[q]),
                        "burst", string.format("%.0f", rate_burst[q]))
                    -- Kept an hour past a full bucket, so the Inspector can show the rate.
                    redis.call("PEXPIRE", rate_key, math.ceil((new - now_us()) / 1000) + 3600000)
                end
                if problem then
                    if #taken == 0 then
                        return redis.error_reply(problem)
                    end
                    done = true
                    break
                end
                if here >= room and got < want and not full and redis.call("LLEN", pending) > 0 then
                    held[#held + 1] = q
                end
                if got >= want or full then
                    if got >= want and redis.call("LLEN", pending) == 0 then
                        empty[#empty + 1] = q
                    end
                    done = true
                    break
                end
            end
        end
    end
    first = last + 1
end
return {empty, taken, full and 1 or 0, held}

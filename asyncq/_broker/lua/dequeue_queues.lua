-- Take up to ARGV[2] tasks from many queues in one call, trying them in order
-- (asyncq; each task moves exactly as asynq's Dequeue moves it, same keys).
-- ARGV[1] lease expiry, unix seconds
-- ARGV[2] maximum number of tasks to take
-- ARGV[3] byte budget: stop before a task whose msg would take the bytes taken
--         past it; -1 = no budget
-- ARGV[4] 1 = the first task taken may exceed the budget (nothing else in flight)
-- ARGV[5] queues per EXISTS probe (1 on a cluster: one command cannot span slots)
-- ARGV[6..] queue names, in the order to try them
-- The keys are built from the names (asynq:{<q>}:pending, :paused, :active,
-- :lease, :t:<id>): passing names instead of four keys per queue keeps a call
-- over thousands of queues small. On a cluster every queue of one call is on
-- the node the call goes to (see multiqueue.py).
-- Each task moves from the tail of pending to the head of active, gets
-- state=active, loses pending_since and is leased until ARGV[1]. The queues
-- are looked at ARGV[5] at a time: one EXISTS over their pending lists skips a
-- chunk of empty queues; in a chunk with work an empty queue costs one LLEN, a
-- non-empty paused one an EXISTS more.
-- Returns {empty, taken, full}: empty lists the 1-based positions (in ARGV[6..])
-- of the queues found empty or paused (those looked at, drained ones included);
-- taken is a flat array position, id, msg, ...; full is 1 when the byte budget
-- stopped the call. An id whose hash is gone is taken out of active again and
-- returned with msg false, so the caller can log it.
local want = tonumber(ARGV[2])
local budget = tonumber(ARGV[3])
local first_free = ARGV[4] == "1"
local nqueues = #ARGV - 5
local CHUNK = tonumber(ARGV[5])
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
        pendings[#pendings + 1] = "asynq:{" .. ARGV[5 + q] .. "}:pending"
    end
    -- One EXISTS over the chunk: empty lists do not exist, so an idle chunk costs
    -- one native command instead of an LLEN per queue.
    if redis.call("EXISTS", unpack(pendings)) == 0 then
        for q = first, last do
            empty[#empty + 1] = q
        end
    else
        for q = first, last do
            local base = "asynq:{" .. ARGV[5 + q] .. "}:"
            local pending = pendings[q - first + 1]
            if redis.call("LLEN", pending) == 0 or redis.call("EXISTS", base .. "paused") == 1 then
                empty[#empty + 1] = q
            else
                local active = base .. "active"
                local prefix = base .. "t:"
                while got < want do
                    local id = redis.call("RPOPLPUSH", pending, active)
                    if not id then
                        empty[#empty + 1] = q
                        break
                    end
                    local key = prefix .. id
                    local msg = redis.call("HGET", key, "msg")
                    if msg and budget >= 0 then
                        if bytes + #msg > budget and not (got == 0 and first_free) then
                            -- Over the byte budget: undo the move (head of active
                            -- back to the tail of pending) and stop.
                            redis.call("LPOP", active)
                            redis.call("RPUSH", pending, id)
                            full = true
                            break
                        end
                        bytes = bytes + #msg
                    end
                    if msg then
                        redis.call("HSET", key, "state", "active")
                        redis.call("HDEL", key, "pending_since")
                        redis.call("ZADD", base .. "lease", ARGV[1], id)
                        got = got + 1
                    else
                        redis.call("LREM", active, 1, id)
                    end
                    taken[#taken + 1] = q
                    taken[#taken + 1] = id
                    taken[#taken + 1] = msg
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
return {empty, taken, full and 1 or 0}

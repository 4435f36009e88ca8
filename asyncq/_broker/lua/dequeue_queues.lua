-- Take up to ARGV[2] tasks from many queues in one call, trying them in KEYS order
-- (asyncq; each task moves exactly as asynq's Dequeue moves it).
-- KEYS[4i+1..4i+4] pending, paused, active, lease of the i-th queue (0-based)
-- ARGV[1] lease expiry, unix seconds
-- ARGV[2] maximum number of tasks to take
-- ARGV[3] byte budget: stop before a task whose msg would take the bytes taken
--         past it; -1 = no budget
-- ARGV[4] 1 = the first task taken may exceed the budget (nothing else in flight)
-- ARGV[5+i] task key prefix of the i-th queue  asynq:{q}:t:
-- Each task moves from the tail of pending to the head of active, gets
-- state=active, loses pending_since and is leased until ARGV[1]. Empty and
-- paused queues cost one LLEN (and an EXISTS) each.
-- Returns {empty, taken, full}: full is 1 when the byte budget stopped the call;
-- empty lists the 1-based indexes of the queues found
-- empty or paused (those looked at, drained ones included); taken is a flat
-- array index, id, msg, ... An id whose hash is gone is taken out of active
-- again and returned with msg false, so the caller can log it.
-- K and A are KEYS and ARGV (see multiqueue.py: on a cluster the keys come in ARGV).
local nqueues = #K / 4
local want = tonumber(A[2])
local budget = tonumber(A[3])
local first_free = A[4] == "1"
local bytes = 0
local got = 0
local empty = {}
local taken = {}
local full = false
for q = 1, nqueues do
    local base = (q - 1) * 4
    local pending = K[base + 1]
    if redis.call("LLEN", pending) == 0 or redis.call("EXISTS", K[base + 2]) == 1 then
        empty[#empty + 1] = q
    else
        local active = K[base + 3]
        local prefix = A[4 + q]
        while got < want do
            local id = redis.call("LINDEX", pending, -1)
            if not id then
                empty[#empty + 1] = q
                break
            end
            local key = prefix .. id
            if budget >= 0 then
                local size = redis.call("HSTRLEN", key, "msg")
                if bytes + size > budget and not (got == 0 and first_free) then
                    full = true
                    break
                end
                bytes = bytes + size
            end
            redis.call("RPOPLPUSH", pending, active)
            local msg = redis.call("HGET", key, "msg")
            if msg then
                redis.call("HSET", key, "state", "active")
                redis.call("HDEL", key, "pending_since")
                redis.call("ZADD", K[base + 4], A[1], id)
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
            break
        end
    end
end
return {empty, taken, full and 1 or 0}

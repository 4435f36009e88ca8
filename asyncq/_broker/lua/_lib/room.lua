-- _lib/room.lua (after guard): the rule "may this queue give a task now?", written once
-- for the two ways a task leaves a queue: a fetch (dequeue_queues.lua) and a direct
-- delivery (enqueue.lua). "Waiting tasks first" is each caller's: a fetch takes the
-- tail of pending, a delivery happens only while pending is empty.
-- now_us(): Redis TIME in microseconds, read once per call: the clock of the rate
-- buckets, state shared by every worker whatever its own clock (scripts are replicated
-- by effects, so reading TIME is allowed). Leases use the caller's clock instead.
local clock_us = nil
local function now_us()
    if not clock_us then
        local t = redis.call("TIME")
        clock_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
    end
    return clock_us
end
-- queue_room(base, want, now, fleet, loc, iv, burst): how many of want tasks the queue whose
-- keys start with base ("asynq:{q}:") may give now. Returns nil when the queue is
-- paused; else n (<= 0: held by its limit, its rate or its order), the rate bucket's tat
-- to move on when tasks are given (nil without a rate), and the error reply
-- text when a key read or written for the queue holds another type (n is 0 then, and
-- nothing may be written).
--   now: unix seconds of the caller's clock; only live leases (ZCOUNT lease now +inf)
--        count against the limit, so a dead worker's expired leases hold nothing.
--   fleet: the configured fleet-wide limit (nil or < 0: none); a stored
--        asynq:{q}:asyncq:limit overrides it.
--   loc: the room left under the server-local limit (nil or < 0: none).
--   iv, burst: the rate (nil: none), a GCRA token bucket giving one task every iv
--        microseconds and holding at most burst, its state the hash asynq:{q}:asyncq:rate.
-- Ordered queues (asynq:{q}:asyncq:ordered = "1") give one task at a time, counting every
-- id in active (a dead worker's task too, until the recoverer moves it on), and none
-- while the retry set holds a task (head-of-line: the failed task goes first;
-- forward_queues.lua puts it back at the tail of pending, the end taken next).
local function queue_room(base, want, now, fleet, loc, iv, burst)
    if redis.call("EXISTS", base .. "paused") == 1 then
        return nil
    end
    local active, lease, limit_key = base .. "active", base .. "lease", base .. "asyncq:limit"
    local problem = bad(active, "list") or bad(lease, "zset") or bad(limit_key, "string")
        or (iv and bad(base .. "asyncq:rate", "hash"))
    if problem then
        return 0, nil, problem
    end
    local n = want
    local limit = tonumber(redis.call("GET", limit_key) or fleet or -1)
    if limit and limit >= 0 then
        n = math.min(n, limit - redis.call("ZCOUNT", lease, now, "+inf"))
    end
    if loc and loc >= 0 then
        n = math.min(n, loc)
    end
    if n > 0 and redis.pcall("GET", base .. "asyncq:ordered") == "1" then
        problem = bad(base .. "retry", "zset")
        if problem then
            return 0, nil, problem
        end
        if redis.call("ZCARD", base .. "retry") > 0 then
            n = 0
        else
            n = math.min(n, 1 - redis.call("LLEN", active))
        end
    end
    local tat = nil
    if iv and n > 0 then
        -- GCRA: the bucket is full when tat <= now; each task moves tat on by iv; a task
        -- may start while tat - now <= (burst - 1) * iv.
        local t = now_us()
        -- A tat no worker writes (nan, inf, or later than a full bucket reserves) would
        -- hold the queue for good, or fail the fetch's write after its moves: the bucket
        -- starts full instead.
        local stored = tonumber(redis.call("HGET", base .. "asyncq:rate", "tat") or "0")
        if not stored or stored ~= stored or stored > t + burst * iv then
            stored = 0
        end
        tat = math.max(stored, t)
        n = math.min(n, math.floor((t + burst * iv - tat) / iv))
    end
    return n, tat
end

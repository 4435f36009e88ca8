-- include: guard
-- asyncq durable functions: deliver a signal. Every run waiting for it (its set of
-- "<run id> <step index>") gets the payload recorded as that wait's result and goes
-- from scheduled to pending; when no run took it, the signal is kept for a while (a
-- string with an expiry) for the first wait that comes (durable_suspend.lua).
-- KEYS[1] the signal's waiting-runs set   KEYS[2] the kept signal
-- KEYS[3] scheduled   KEYS[4] pending (of the queue the signal is sent in)
-- ARGV[1] payload (JSON)   ARGV[2] how long it is kept (ms)   ARGV[3] now (unix ns)
-- ARGV[4] the queue's key prefix "asynq:{<queue>}:"   ARGV[5] wake-up channel
-- ARGV[6] queue name
-- Returns how many waiting runs took it (0: it is kept).
local problem = bad(KEYS[1], "set") or bad(KEYS[2], "string") or bad(KEYS[3], "zset")
    or bad(KEYS[4], "list")
local waiting = {}
if not problem then
    for _, m in ipairs(redis.call("SMEMBERS", KEYS[1])) do
        local id, i = string.match(m, "^(.+) (%d+)$")
        if id then
            local run, tkey = ARGV[4] .. "asyncq:run:" .. id, ARGV[4] .. "t:" .. id
            problem = bad(run, "hash") or bad(tkey, "hash")
            if problem then
                break
            end
            waiting[#waiting + 1] = {id = id, i = i, run = run, tkey = tkey}
        end
    end
end
if problem then
    return redis.error_reply(problem)
end
local took = 0
for _, w in ipairs(waiting) do
    -- a wait that timed out meanwhile recorded its None: the signal is not its
    if redis.call("EXISTS", w.run) == 1 and redis.call("HEXISTS", w.run, "r:" .. w.i) == 0 then
        redis.call("HSET", w.run, "r:" .. w.i, ARGV[1])
        took = took + 1
        if redis.call("ZREM", KEYS[3], w.id) == 1 then
            redis.call("HSET", w.tkey, "state", "pending", "pending_since", ARGV[3])
            redis.call("LPUSH", KEYS[4], w.id)
            redis.call("HSET", w.run, "state", "running")
            redis.call("HDEL", w.run, "until")
        end
    end
end
redis.call("DEL", KEYS[1])
if took == 0 then
    redis.call("SET", KEYS[2], ARGV[1], "PX", ARGV[2])
else
    redis.pcall("PUBLISH", ARGV[5], ARGV[6])
end
return took

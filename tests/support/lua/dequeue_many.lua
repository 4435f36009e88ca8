-- Take up to ARGV[3] tasks from one queue (asynq Dequeue, batched by asyncq).
-- KEYS[1] pending
-- KEYS[2] paused
-- KEYS[3] active
-- KEYS[4] lease
-- ARGV[1] lease expiry, unix seconds
-- ARGV[2] task key prefix  asynq:{q}:t:
-- ARGV[3] asyncq: maximum number of tasks to take
-- Each task moves from the tail of pending to the head of active, gets
-- state=active, loses pending_since and is leased until ARGV[1].
-- Returns a flat array id1, msg1, id2, msg2, ... (empty when paused or empty).
-- An id whose hash is gone cannot be run: it is taken out of active again and
-- returned with a nil msg so the caller can log it.
-- asyncq: nothing is written when a key holds another type. The lease set is
-- checked first; each id's hash is read before the id is moved, and a hash of
-- another type stops the batch there (an error when it is the first id), so no
-- id is left in active without its lease or state.
if redis.call("EXISTS", KEYS[2]) == 1 then
    return {}
end
if not ({none=true, zset=true})[redis.call("TYPE", KEYS[4]).ok] then
    return redis.error_reply("WRONGTYPE " .. KEYS[4] .. " is not a zset")
end
local out = {}
for _ = 1, tonumber(ARGV[3]) do
    local id = redis.call("LINDEX", KEYS[1], -1)
    if not id then
        break
    end
    local key = ARGV[2] .. id
    local msg = redis.pcall("HGET", key, "msg")
    if type(msg) == "table" and msg.err then
        if #out == 0 then
            return msg
        end
        break
    end
    redis.call("RPOPLPUSH", KEYS[1], KEYS[3])
    if msg then
        redis.call("HSET", key, "state", "active")
        redis.call("HDEL", key, "pending_since")
        redis.call("ZADD", KEYS[4], ARGV[1], id)
    else
        redis.call("LREM", KEYS[3], 1, id)
    end
    out[#out + 1] = id
    out[#out + 1] = msg
end
return out

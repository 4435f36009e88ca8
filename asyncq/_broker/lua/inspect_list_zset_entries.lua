-- Inspector: one page of a task-ID sorted set, ascending by score (asynq
-- listZSetEntries; scheduled, retry, archived, completed and groups).
-- KEYS[1] sorted set key
-- ARGV[1] start  ARGV[2] stop  ARGV[3] task key prefix
-- Returns a flat list of (id, msg, score, result) quadruples; msg/result are
-- false (nil) when missing, so the entries stay aligned.
local res = {}
local entries = redis.call("ZRANGE", KEYS[1], ARGV[1], ARGV[2], "WITHSCORES")
for i = 1, #entries, 2 do
    local id = entries[i]
    local msg, result = unpack(redis.call("HMGET", ARGV[3] .. id, "msg", "result"))
    table.insert(res, id)
    table.insert(res, msg)
    table.insert(res, entries[i + 1])
    table.insert(res, result)
end
return res

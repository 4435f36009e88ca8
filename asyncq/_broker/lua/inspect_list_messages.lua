-- Inspector: one page of a task-ID list (asynq listMessages; pending and active).
-- KEYS[1] list key
-- ARGV[1] start  ARGV[2] stop  ARGV[3] task key prefix
-- Returns a flat list of (id, msg, result) triples in list order; msg/result are
-- false (nil) when the hash or the field is missing, so the triples stay aligned.
local res = {}
for _, id in ipairs(redis.call("LRANGE", KEYS[1], ARGV[1], ARGV[2])) do
    local msg, result = unpack(redis.call("HMGET", ARGV[3] .. id, "msg", "result"))
    table.insert(res, id)
    table.insert(res, msg)
    table.insert(res, result)
end
return res

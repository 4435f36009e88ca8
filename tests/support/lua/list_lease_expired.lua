-- Active tasks whose lease expired (asynq ListLeaseExpired). Read-only.
-- KEYS[1] lease
-- ARGV[1] cutoff, unix seconds
-- ARGV[2] task key prefix
-- Returns a flat array id1, msg1, ... (asyncq adds the ids so that a message
-- that cannot be decoded can still be archived by id); ids without a hash
-- are skipped, as in asynq.
local out = {}
for _, id in ipairs(redis.call("ZRANGEBYSCORE", KEYS[1], "-inf", ARGV[1])) do
    local msg = redis.call("HGET", ARGV[2] .. id, "msg")
    if msg then
        out[#out + 1] = id
        out[#out + 1] = msg
    end
end
return out

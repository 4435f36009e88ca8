-- Active tasks whose lease expired, over many queues (asyncq; per queue what
-- list_lease_expired.lua returns, asynq's ListLeaseExpired). Read-only.
-- KEYS[i] lease set of the i-th queue
-- ARGV[1] cutoff, unix seconds
-- ARGV[1+i] task key prefix of the i-th queue
-- Returns a flat array index, id, msg, ...; ids without a hash are skipped.
-- K and A are KEYS and ARGV (see multiqueue.py: on a cluster the keys come in ARGV).
local out = {}
for q = 1, #K do
    local prefix = A[1 + q]
    for _, id in ipairs(redis.call("ZRANGEBYSCORE", K[q], "-inf", A[1])) do
        local msg = redis.call("HGET", prefix .. id, "msg")
        if msg then
            out[#out + 1] = q
            out[#out + 1] = id
            out[#out + 1] = msg
        end
    end
end
return out

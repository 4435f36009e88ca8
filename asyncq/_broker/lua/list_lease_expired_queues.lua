-- Active tasks whose lease expired, over many queues (asyncq; per queue what
-- list_lease_expired.lua returns, asynq's ListLeaseExpired). Read-only.
-- ARGV[1] cutoff, unix seconds
-- ARGV[2..] queue names; keys are built from them (asynq:{<q>}:lease, :t:<id>)
-- Returns a flat array position (1 = ARGV[2]), id, msg, ...; ids without a hash
-- are skipped.
local out = {}
for q = 2, #ARGV do
    local base = "asynq:{" .. ARGV[q] .. "}:"
    for _, id in ipairs(redis.call("ZRANGEBYSCORE", base .. "lease", "-inf", ARGV[1])) do
        local msg = redis.call("HGET", base .. "t:" .. id, "msg")
        if msg then
            out[#out + 1] = q - 1
            out[#out + 1] = id
            out[#out + 1] = msg
        end
    end
end
return out

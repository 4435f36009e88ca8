-- Active tasks whose lease expired, over many queues (asyncq; per queue what
-- list_lease_expired.lua returns, asynq's ListLeaseExpired), and the earliest
-- lease still running after the cutoff, so the recoverer can sleep until then.
-- Read-only.
-- ARGV[1] cutoff, unix seconds
-- ARGV[2..] queue names; keys are built from them (asynq:{<q>}:lease, :t:<id>)
-- Returns {next, position (1 = ARGV[2]), id, msg, ...}: next is the smallest
-- lease score above the cutoff in any of the queues ("" when none); ids without
-- a hash are skipped.
local out = {""}
local next_expiry = nil
for q = 2, #ARGV do
    local lease = "asynq:{" .. ARGV[q] .. "}:lease"
    local prefix = "asynq:{" .. ARGV[q] .. "}:t:"
    for _, id in ipairs(redis.call("ZRANGEBYSCORE", lease, "-inf", ARGV[1])) do
        local msg = redis.call("HGET", prefix .. id, "msg")
        if msg then
            out[#out + 1] = q - 1
            out[#out + 1] = id
            out[#out + 1] = msg
        end
    end
    local later = redis.call("ZRANGEBYSCORE", lease, "(" .. ARGV[1], "+inf", "WITHSCORES", "LIMIT", 0, 1)
    if later[2] then
        local score = tonumber(later[2])
        if next_expiry == nil or score < next_expiry then
            next_expiry = score
        end
    end
end
if next_expiry ~= nil then
    out[1] = string.format("%.17g", next_expiry)
end
return out

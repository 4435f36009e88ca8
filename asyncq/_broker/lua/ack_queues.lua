-- Acknowledge the finished tasks of SEVERAL queues in one call (asyncq): the
-- Python side prepends ack_many.lua wrapped as `local function ack_one(KEYS, ARGV)`,
-- so each queue gets exactly what its own ack_many.lua call would do.
-- ARGV: per queue, in order: its five ack_many KEYS (active, lease, completed,
-- processed:<day>, processed), the number n of its ack_many ARGV, then those n.
-- Keys are not declared: single Redis server only (a cluster gets one
-- ack_many call per queue).
-- Returns one reply per queue: ack_many's array, or its error (an error element).
local out = {}
local a = 1
while a <= #ARGV do
    local k = {ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]}
    local n = tonumber(ARGV[a + 5])
    local args = {}
    for i = 1, n do
        args[i] = ARGV[a + 5 + i]
    end
    -- A failing command (WRONGTYPE, ...) fails this queue's reply only, as its own
    -- ack_many call would; what that queue already did stays done, as it would.
    local ok, res = pcall(ack_one, k, args)
    if not ok then
        if type(res) == "table" and res.err then
            res = redis.error_reply(res.err)
        else
            res = redis.error_reply(tostring(res))
        end
    end
    out[#out + 1] = res
    a = a + 6 + n
end
return out

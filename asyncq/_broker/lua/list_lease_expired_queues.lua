-- Active tasks whose lease expired, over many queues (asyncq; per queue what
-- list_lease_expired.lua returns, asynq's ListLeaseExpired), and the earliest
-- lease still running after the cutoff, so the recoverer can sleep until then.
-- Read-only.
-- ARGV[1] cutoff, unix seconds
-- ARGV[2] queues per EXISTS probe (1 on a cluster: one command cannot span slots)
-- ARGV[3..] queue names; keys are built from them (asynq:{<q>}:lease, :t:<id>)
-- One EXISTS over a chunk's lease sets skips a chunk of queues with nothing active.
-- Returns {next, position (1 = ARGV[3]), id, msg, ...}: next is the smallest
-- lease score above the cutoff in any of the queues ("" when none); ids without
-- a hash are skipped.
-- A lease set of another type skips its queue, a task key of another type its
-- task, so one damaged queue does not hide the others' expired leases: each
-- adds the triple {0, "WRONGTYPE <key> is not a <kind>", ""}.
local out = {""}
local next_expiry = nil
local function damaged(key, kind)
    out[#out + 1] = 0
    out[#out + 1] = "WRONGTYPE " .. key .. " is not a " .. kind
    out[#out + 1] = ""
end
local NAMES = 2
local CHUNK = tonumber(ARGV[2])
local function scan_queue(q)
    local lease = "asynq:{" .. ARGV[q] .. "}:lease"
    local prefix = "asynq:{" .. ARGV[q] .. "}:t:"
    local expired = redis.pcall("ZRANGEBYSCORE", lease, "-inf", ARGV[1])
    local readable = not expired.err
    if not readable then
        damaged(lease, "zset")
        expired = {}
    end
    for _, id in ipairs(expired) do
        local msg = redis.pcall("HGET", prefix .. id, "msg")
        if type(msg) == "table" and msg.err then
            damaged(prefix .. id, "hash")
        elseif msg then
            out[#out + 1] = q - NAMES
            out[#out + 1] = id
            out[#out + 1] = msg
        end
    end
    local later = {}
    if readable then
        later = redis.call("ZRANGEBYSCORE", lease, "(" .. ARGV[1], "+inf", "WITHSCORES", "LIMIT", 0, 1)
    end
    if later[2] then
        local score = tonumber(later[2])
        if next_expiry == nil or score < next_expiry then
            next_expiry = score
        end
    end
end
local first = NAMES + 1
while first <= #ARGV do
    local last = math.min(#ARGV, first + CHUNK - 1)
    local leases = {}
    for q = first, last do
        leases[#leases + 1] = "asynq:{" .. ARGV[q] .. "}:lease"
    end
    if redis.call("EXISTS", unpack(leases)) > 0 then
        for q = first, last do
            scan_queue(q)
        end
    end
    first = last + 1
end
if next_expiry ~= nil then
    out[1] = string.format("%.17g", next_expiry)
end
return out

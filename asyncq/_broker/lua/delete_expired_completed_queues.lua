-- Delete completed tasks whose retention expired, over many queues (asyncq; per
-- queue what delete_expired_completed.lua does, asynq's janitor).
-- ARGV[1] now, unix seconds
-- ARGV[2] batch size per queue
-- ARGV[3] queues per EXISTS probe (1 on a cluster: one command cannot span slots)
-- ARGV[4..] queue names; keys are built from them (asynq:{<q>}:completed, :t:<id>)
-- One EXISTS over a chunk's completed sets skips a chunk of queues with none.
-- Returns {deleted, more}: more is 1 when a queue had a full batch (call again).
-- A queue whose completed set holds another type is skipped, so one damaged queue
-- does not stop the others' cleanup; the reply then has a third element listing
-- "WRONGTYPE <key> is not a zset".
local batch = tonumber(ARGV[2])
local NAMES = 3
local CHUNK = tonumber(ARGV[3])
local deleted = 0
local more = 0
local problems = {}
local function clean_queue(name)
    local base = "asynq:{" .. name .. "}:"
    local completed = base .. "completed"
    local ids = redis.pcall("ZRANGEBYSCORE", completed, "-inf", ARGV[1], "LIMIT", 0, batch)
    if ids.err then
        problems[#problems + 1] = "WRONGTYPE " .. completed .. " is not a zset"
        ids = {}
    end
    for _, id in ipairs(ids) do
        redis.call("DEL", base .. "t:" .. id)
        redis.call("ZREM", completed, id)
    end
    deleted = deleted + #ids
    if #ids == batch then
        more = 1
    end
end
local first = NAMES + 1
while first <= #ARGV do
    local last = math.min(#ARGV, first + CHUNK - 1)
    local sets = {}
    for q = first, last do
        sets[#sets + 1] = "asynq:{" .. ARGV[q] .. "}:completed"
    end
    if redis.call("EXISTS", unpack(sets)) > 0 then
        for q = first, last do
            clean_queue(ARGV[q])
        end
    end
    first = last + 1
end
if #problems > 0 then
    return {deleted, more, problems}
end
return {deleted, more}

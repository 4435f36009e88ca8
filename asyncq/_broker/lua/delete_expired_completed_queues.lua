-- Delete completed tasks whose retention expired, over many queues (asyncq; per
-- queue what delete_expired_completed.lua does, asynq's janitor).
-- ARGV[1] now, unix seconds
-- ARGV[2] batch size per queue
-- ARGV[3..] queue names; keys are built from them (asynq:{<q>}:completed, :t:<id>)
-- Returns {deleted, more}: more is 1 when a queue had a full batch (call again).
-- A queue whose completed set holds another type is skipped, so one damaged queue
-- does not stop the others' cleanup; the reply then has a third element listing
-- "WRONGTYPE <key> is not a zset".
local batch = tonumber(ARGV[2])
local deleted = 0
local more = 0
local problems = {}
for q = 3, #ARGV do
    local base = "asynq:{" .. ARGV[q] .. "}:"
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
if #problems > 0 then
    return {deleted, more, problems}
end
return {deleted, more}

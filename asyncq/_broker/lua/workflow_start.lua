-- asyncq workflows: write a workflow hash and enqueue its first stage, atomically.
-- KEYS[1] workflow hash
-- ARGV[1] now (unix ns, pending_since)   ARGV[2] number of field/value pairs (F)
-- ARGV[3 .. 2+2F] the workflow hash's fields and values
-- then per first-stage member, in order: queue, task id, type, msg (the script writes
-- the member's fields id:, q:, t:, st: of the workflow hash)
-- Nothing is written when the workflow or any first-stage task id already exists.
if redis.call("EXISTS", KEYS[1]) == 1 then
    return redis.error_reply("WORKFLOW EXISTS")
end
local f = tonumber(ARGV[2])
local first = 3 + 2 * f
for i = first, #ARGV, 4 do
    if redis.call("EXISTS", "asynq:{" .. ARGV[i] .. "}:t:" .. ARGV[i + 1]) == 1 then
        return redis.error_reply("TASK EXISTS " .. ARGV[i + 1])
    end
end
-- Commands take their arguments on the Lua stack: long lists go in slices (of
-- whole field/value pairs).
local SLICE = 1000
for i = 3, 2 + 2 * f, SLICE do
    redis.call("HSET", KEYS[1], unpack(ARGV, i, math.min(i + SLICE - 1, 2 + 2 * f)))
end
local pushed, queues, members = {}, {}, {}
for i = first, #ARGV, 4 do
    local q, id = ARGV[i], ARGV[i + 1]
    redis.call("HSET", "asynq:{" .. q .. "}:t:" .. id, "msg", ARGV[i + 3], "state", "pending",
        "pending_since", ARGV[1])
    local m = "0:" .. (i - first) / 4
    local n = #members
    members[n + 1], members[n + 2] = "id:" .. m, id
    members[n + 3], members[n + 4] = "q:" .. m, q
    members[n + 5], members[n + 6] = "t:" .. m, ARGV[i + 2]
    members[n + 7], members[n + 8] = "st:" .. m, "pending"
    if not pushed[q] then
        pushed[q] = {}
        queues[#queues + 1] = q
    end
    local ids = pushed[q]
    ids[#ids + 1] = id
end
for i = 1, #members, SLICE do
    redis.call("HSET", KEYS[1], unpack(members, i, math.min(i + SLICE - 1, #members)))
end
-- one LPUSH of many ids is those LPUSHes one by one, in the same order
for _, q in ipairs(queues) do
    local ids = pushed[q]
    for i = 1, #ids, SLICE do
        redis.call("LPUSH", "asynq:{" .. q .. "}:pending", unpack(ids, i, math.min(i + SLICE - 1, #ids)))
    end
    redis.pcall("PUBLISH", "asyncq:wakeup:{" .. q .. "}", q)
end
return "OK"

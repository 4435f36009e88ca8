-- asyncq workflows: write a workflow hash and enqueue its first stage, atomically.
-- KEYS[1] workflow hash
-- ARGV[1] now (unix ns, pending_since)   ARGV[2] number of field/value pairs (F)
-- ARGV[3 .. 2+2F] the workflow hash's fields and values
-- then triples: queue, task id, msg of each first-stage member
-- Nothing is written when the workflow or any first-stage task id already exists.
if redis.call("EXISTS", KEYS[1]) == 1 then
    return redis.error_reply("WORKFLOW EXISTS")
end
local f = tonumber(ARGV[2])
local first = 3 + 2 * f
for i = first, #ARGV, 3 do
    if redis.call("EXISTS", "asynq:{" .. ARGV[i] .. "}:t:" .. ARGV[i + 1]) == 1 then
        return redis.error_reply("TASK EXISTS " .. ARGV[i + 1])
    end
end
for i = 3, 2 + 2 * f, 2 do
    redis.call("HSET", KEYS[1], ARGV[i], ARGV[i + 1])
end
for i = first, #ARGV, 3 do
    local q, id = ARGV[i], ARGV[i + 1]
    redis.call("HSET", "asynq:{" .. q .. "}:t:" .. id, "msg", ARGV[i + 2], "state", "pending",
        "pending_since", ARGV[1])
    redis.call("LPUSH", "asynq:{" .. q .. "}:pending", id)
    redis.pcall("PUBLISH", "asyncq:wakeup:{" .. q .. "}", q)
end
return "OK"

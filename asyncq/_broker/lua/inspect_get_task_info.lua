-- Inspector: one task (asynq GetTaskInfo).
-- KEYS[1] task key
-- ARGV[1] task ID  ARGV[2] now (unix s)  ARGV[3] queue key prefix
-- Returns {msg, state, next process time (unix s, 0 = none), result, asyncq_error}, or
-- the error reply NOT FOUND. asyncq_error is the reason asyncq stored when it archived
-- a message it could not decode.
if redis.call("EXISTS", KEYS[1]) == 0 then
    return redis.error_reply("NOT FOUND")
end
local msg, state, result, reason = unpack(
    redis.call("HMGET", KEYS[1], "msg", "state", "result", "asyncq_error"))
local next_at = 0
if state == "scheduled" or state == "retry" then
    next_at = redis.call("ZSCORE", ARGV[3] .. state, ARGV[1]) or 0
elseif state == "pending" then
    next_at = ARGV[2]
end
return {msg, state, next_at, result, reason}

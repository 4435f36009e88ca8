-- Inspector: replace a scheduled task's message (asynq UpdateTaskPayload).
-- KEYS[1] task key  ARGV[1] new TaskMessage bytes
-- Only the msg field changes; state, pending_since, group and unique_key stay.
-- Returns 1 updated, 0 not found, -1 not in the scheduled state.
if redis.call("EXISTS", KEYS[1]) == 0 then
    return 0
end
if redis.call("HGET", KEYS[1], "state") ~= "scheduled" then
    return -1
end
redis.call("HSET", KEYS[1], "msg", ARGV[1])
return 1

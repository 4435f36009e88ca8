-- Scheduler heartbeat record (asynq WriteSchedulerEntries).
-- KEYS[1] asynq:schedulers:{<scheduler id>}
-- ARGV[1] TTL, whole seconds
-- ARGV[2...] SchedulerEntry bytes, LPUSHed one by one (so stored reversed)
redis.call("DEL", KEYS[1])
for i = 2, #ARGV do
    redis.call("LPUSH", KEYS[1], ARGV[i])
end
redis.call("EXPIRE", KEYS[1], ARGV[1])
return redis.status_reply("OK")

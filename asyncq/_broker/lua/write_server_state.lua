-- Server heartbeat record (asynq WriteServerState).
-- KEYS[1] asynq:servers:{host:pid:sid}
-- KEYS[2] asynq:workers:{host:pid:sid}
-- ARGV[1] TTL, whole seconds
-- ARGV[2] ServerInfo bytes
-- ARGV[3...] pairs of task id, WorkerInfo bytes
redis.call("SETEX", KEYS[1], ARGV[1], ARGV[2])
redis.call("DEL", KEYS[2])
for i = 3, #ARGV, 2 do
    redis.call("HSET", KEYS[2], ARGV[i], ARGV[i + 1])
end
redis.call("EXPIRE", KEYS[2], ARGV[1])
return redis.status_reply("OK")

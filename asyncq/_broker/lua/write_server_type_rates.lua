-- asyncq: a server's per-task-type rate limits, beside its asynq heartbeat record.
-- KEYS[1] asyncq:server_type_rates:{host:pid:sid} (same slot as asynq:servers:{host:pid:sid})
-- ARGV[1] TTL, whole seconds (the heartbeat's)
-- ARGV[2...] pairs of task type, rate text ("600/min")
-- Replaced whole (DEL first) so the hash holds exactly the server's configuration.
redis.call("DEL", KEYS[1])
for i = 2, #ARGV, 2 do
    redis.call("HSET", KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call("EXPIRE", KEYS[1], ARGV[1])
return redis.status_reply("OK")

-- Append to a periodic entry's enqueue history (asynq RecordSchedulerEnqueueEvent).
-- KEYS[1] asynq:scheduler_history:<entry id>
-- ARGV[1] enqueue time, unix seconds
-- ARGV[2] SchedulerEnqueueEvent bytes
-- ARGV[3] history cap (1000)
-- Drops all but the newest cap-1 events, then adds this one.
redis.call("ZREMRANGEBYRANK", KEYS[1], 0, -tonumber(ARGV[3]))
redis.call("ZADD", KEYS[1], ARGV[1], ARGV[2])
return redis.status_reply("OK")

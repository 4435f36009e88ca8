-- Inspector: live members of asynq:servers, asynq:workers or asynq:schedulers
-- (asynq listServerKeys); members that expired more than a second ago are pruned.
-- KEYS[1] the index sorted set  ARGV[1] now (unix s)
local now = tonumber(ARGV[1])
local keys = redis.call("ZRANGEBYSCORE", KEYS[1], now, "+inf")
redis.call("ZREMRANGEBYSCORE", KEYS[1], "-inf", now - 1)
return keys

-- Add one flush of a worker's metrics history to a queue's minute hash.
-- KEYS[1]: asynq:{<queue>}:metrics:<unix minute>
-- ARGV[1]: unix time (s) at which the hash expires (the minute's end plus the retention)
-- ARGV[2], ARGV[3], ...: field, increment pairs ("p:<type>" processed, "f:<type>" failed,
-- "r:<type>" retried, "a:<type>" archived, "us:<type>" run time in microseconds,
-- "h<k>:<type>" runs in histogram bucket k)
for i = 2, #ARGV, 2 do
  redis.call("HINCRBY", KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call("EXPIREAT", KEYS[1], ARGV[1])
return 1

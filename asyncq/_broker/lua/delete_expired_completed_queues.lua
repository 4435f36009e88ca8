-- Delete completed tasks whose retention expired, over many queues (asyncq; per
-- queue what delete_expired_completed.lua does, asynq's janitor).
-- KEYS[i] completed set of the i-th queue
-- ARGV[1] now, unix seconds
-- ARGV[2] batch size per queue
-- ARGV[2+i] task key prefix of the i-th queue
-- Returns {deleted, more}: more is 1 when a queue had a full batch (call again).
-- K and A are KEYS and ARGV (see multiqueue.py: on a cluster the keys come in ARGV).
local batch = tonumber(A[2])
local deleted = 0
local more = 0
for q = 1, #K do
    local prefix = A[2 + q]
    local ids = redis.call("ZRANGEBYSCORE", K[q], "-inf", A[1], "LIMIT", 0, batch)
    for _, id in ipairs(ids) do
        redis.call("DEL", prefix .. id)
        redis.call("ZREM", K[q], id)
    end
    deleted = deleted + #ids
    if #ids == batch then
        more = 1
    end
end
return {deleted, more}

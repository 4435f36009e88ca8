-- include: guard
-- asyncq: an idle worker asks to be delivered its next task directly (see enqueue.lua).
-- ARGV[1] the worker's delivery key asyncq:delivery:<server id> (also its channel)
-- ARGV[2] how long the credit lasts, milliseconds (the worker renews it while idle)
-- ARGV[3] the member it writes in each queue's waiters list: "<lease seconds>:<ARGV[1]>"
-- ARGV[4] how long a waiters list lasts, milliseconds (each registration renews it, so
--         the list of a queue nobody waits for any more goes away)
-- ARGV[5..] queue names: the queues to be registered in (none: renew the credit only)
-- The credit is 1: one task at a time, since the worker asks again once it started it.
-- Returns 1 when the credit was renewed or the queues registered, 0 when the credit had
-- expired and no queue names came (an enqueue may have dropped the member from a list
-- meanwhile): the worker calls again with its queues.
local had = redis.call("EXISTS", ARGV[1])
if had == 0 and #ARGV < 5 then
    return 0
end
redis.call("SET", ARGV[1], "1", "PX", ARGV[2])
for i = 5, #ARGV do
    local waiters = "asynq:{" .. ARGV[i] .. "}:asyncq:waiters"
    if not bad(waiters, "list") then -- a key of another type is left alone
        redis.call("LREM", waiters, 0, ARGV[3])
        redis.call("LPUSH", waiters, ARGV[3]) -- the tail is the longest waiting
        redis.call("PEXPIRE", waiters, ARGV[4])
    end
end
return 1

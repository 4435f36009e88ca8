-- include: guard
-- asyncq: a worker stops being delivered tasks (shutdown; see delivery_arm.lua).
-- ARGV[1] the worker's delivery key  ARGV[2] its member in the waiters lists
-- ARGV[3..] the queues it registered in
-- A note published before this runs still reaches the worker, which requeues its task.
redis.call("DEL", ARGV[1])
for i = 3, #ARGV do
    local waiters = "asynq:{" .. ARGV[i] .. "}:asyncq:waiters"
    if not bad(waiters, "list") then
        redis.call("LREM", waiters, 0, ARGV[2])
    end
end
return 1

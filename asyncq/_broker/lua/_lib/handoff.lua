-- _lib/handoff.lua: a task handed to a worker without a fetch, in the slot of the task
-- before it (a durable run's first step, by its suspension; the run its step's success
-- wakes, by the step's acknowledgement). Written once for durable_suspend.lua and
-- record_step() (_lib/durable_step.lua).
-- may_hand_on(base): whether the queue whose keys start with base ("asynq:{<queue>}:")
-- may hand a task on: not when it is paused, has a stored limit or is ordered, since
-- those give tasks only through a fetch (queue_room(), _lib/room.lua); the worker asks
-- only for queues it has no limit or rate on itself.
local function may_hand_on(base)
    return redis.call("EXISTS", base .. "paused", base .. "asyncq:limit",
        base .. "asyncq:ordered") == 0
end
-- lease_to_caller(base, id, expiry): the task in its queue's active list (at the head,
-- where a fetch's RPOPLPUSH puts it) and leased until expiry (unix s), as a fetch
-- leaves it; the caller sets the task hash's state (and msg).
local function lease_to_caller(base, id, expiry)
    redis.call("LPUSH", base .. "active", id)
    redis.call("ZADD", base .. "lease", expiry, id)
end

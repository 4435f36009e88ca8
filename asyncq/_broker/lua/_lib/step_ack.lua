-- _lib/step_ack.lua (after counters): finish_step(cutoff, limit, strict), the
-- acknowledgement of a step task (a workflow's, a durable run's) in one of four modes,
-- written once for workflow_done.lua and durable_step_done.lua, which share its KEYS
-- and ARGV layout:
-- KEYS[1] active            KEYS[2] lease              KEYS[3] task key
-- KEYS[4] processed:<day>   KEYS[5] processed (all)    KEYS[6] completed
-- KEYS[7] archived          KEYS[8] failed:<day>       KEYS[9] failed (all)
-- KEYS[10] task key prefix of the step's queue
-- ARGV[1] task id    ARGV[2] mode: done | complete | archive | revoke
-- ARGV[3] expiry of the daily counters (unix s)   ARGV[4] max int64   ARGV[5] now (unix s)
-- ARGV[6] msg to store (complete: completed_at set; archive: error set)
-- ARGV[7] completed score (complete)
-- done and revoke delete the task, complete keeps it as completed, archive archives it
-- (trimming the archive: entries up to cutoff, unix s, and beyond limit); the
-- counters are asynq's. Returns the task's result field (false when none), or nil
-- when the task is not active (nothing written then; with strict, also when done or
-- revoke found no task hash, after the task left active and its lease).
local function finish_step(cutoff, limit, strict)
    local mode = ARGV[2]
    if redis.call("LREM", KEYS[1], 0, ARGV[1]) == 0 then
        return nil
    end
    if redis.call("ZREM", KEYS[2], ARGV[1]) == 0 then
        return nil
    end
    local result = redis.call("HGET", KEYS[3], "result")
    if mode == "done" or mode == "revoke" then
        if redis.call("DEL", KEYS[3]) == 0 and strict then
            return nil
        end
    elseif mode == "complete" then
        redis.call("ZADD", KEYS[6], ARGV[7], ARGV[1])
        redis.call("HSET", KEYS[3], "msg", ARGV[6], "state", "completed")
    else
        redis.call("ZADD", KEYS[7], ARGV[5], ARGV[1])
        for _, range in ipairs({
            redis.call("ZRANGE", KEYS[7], "-inf", cutoff, "BYSCORE"),
            redis.call("ZRANGE", KEYS[7], 0, -tonumber(limit)),
        }) do
            for _, id in ipairs(range) do
                if id ~= ARGV[1] then
                    redis.call("DEL", KEYS[10] .. id)
                    redis.call("ZREM", KEYS[7], id)
                end
            end
        end
        redis.call("HSET", KEYS[3], "msg", ARGV[6], "state", "archived")
        count_day(KEYS[8], ARGV[3])
    end
    count_day(KEYS[4], ARGV[3])
    count_total(KEYS[5], mode == "archive" and KEYS[9] or nil, ARGV[4])
    return result
end

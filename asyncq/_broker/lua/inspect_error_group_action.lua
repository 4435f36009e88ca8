-- include: guard
-- Inspector (asyncq failure triage): run, archive or delete the tasks of one error group.
-- KEYS[1] the state's sorted set (retry or archived)  KEYS[2] pending  KEYS[3] archived
-- ARGV[1] action: "run", "archive" (retry tasks only) or "delete"
-- ARGV[2] the state the tasks were seen in ("retry" or "archived")
-- ARGV[3] task key prefix  ARGV[4] now (unix s)  ARGV[5] now (unix ns)
-- ARGV[6] archive cutoff = now - 90 days (unix s)  ARGV[7] archive cap (10000)
-- ARGV[8..] pairs: task ID, SHA1 of the task message as it was when the group was read
-- A task acts only when it is still in that state, still in that sorted set and its
-- message is byte for byte the one read (so it has not failed again with another
-- error meanwhile); any other task is skipped. Returns the IDs acted on.
local action, state = ARGV[1], ARGV[2]
local problem = bad(KEYS[1], "zset") or bad(KEYS[2], "list") or bad(KEYS[3], "zset")
if problem then
    return redis.error_reply(problem)
end
if action == "archive" and state ~= "retry" then
    return redis.error_reply("only retry tasks can be archived")
end
-- Every task key is checked before the first write, so a failed call changes nothing.
for i = 8, #ARGV, 2 do
    problem = bad(ARGV[3] .. ARGV[i], "hash")
    if problem then
        return redis.error_reply(problem)
    end
end
local done = {}
for i = 8, #ARGV, 2 do
    local id, sha = ARGV[i], ARGV[i + 1]
    local tkey = ARGV[3] .. id
    local cur, msg = unpack(redis.call("HMGET", tkey, "state", "msg"))
    if cur == state and msg and redis.sha1hex(msg) == sha
        and redis.call("ZSCORE", KEYS[1], id) then
        redis.call("ZREM", KEYS[1], id)
        if action == "run" then
            redis.call("LPUSH", KEYS[2], id)
            redis.call("HSET", tkey, "state", "pending", "pending_since", ARGV[5])
        elseif action == "archive" then
            redis.call("ZADD", KEYS[3], ARGV[4], id)
            redis.call("HSET", tkey, "state", "archived")
        else
            local ukey = redis.call("HGET", tkey, "unique_key")
            if ukey and ukey ~= "" and redis.call("TYPE", ukey).ok == "string"
                and redis.call("GET", ukey) == id then
                redis.call("DEL", ukey)
            end
            redis.call("DEL", tkey)
        end
        done[#done + 1] = id
    end
end
if action == "archive" and #done > 0 then
    -- The same trim as every archive: older than the cutoff or beyond the cap, hashes too.
    local old = redis.call("ZRANGEBYSCORE", KEYS[3], "-inf", ARGV[6])
    for _, id in ipairs(old) do
        redis.call("DEL", ARGV[3] .. id)
        redis.call("ZREM", KEYS[3], id)
    end
    local excess = redis.call("ZRANGE", KEYS[3], 0, -tonumber(ARGV[7]))
    for _, id in ipairs(excess) do
        redis.call("DEL", ARGV[3] .. id)
        redis.call("ZREM", KEYS[3], id)
    end
end
return done

-- include: guard
-- Put members of aggregation sets past their deadline back into their group, over
-- many queues (asyncq; per queue what reclaim_stale_aggregation_sets.lua does).
-- ARGV[1] now, unix seconds
-- ARGV[2] queues per EXISTS probe (1 on a cluster: one command cannot span slots)
-- ARGV[3..] queue names; keys are built from them (asynq:{<q>}:aggregation_sets,
-- :groups, :g:<group>)
-- One EXISTS over a chunk's aggregation_sets skips a chunk of queues with none.
-- A queue with a key of another type (its aggregation_sets or groups set, a stale
-- set, a group), or a stale set named outside its groups, is skipped before
-- anything of it is written, so one damaged queue does not stop the others.
-- Returns OK, or the list of "WRONGTYPE <key> is not a <kind>" problems.
local problems = {}
local NAMES = 2
local CHUNK = tonumber(ARGV[2])
local function reclaim_queue(name)
    local base = "asynq:{" .. name .. "}:"
    local sets, groups, gprefix = base .. "aggregation_sets", base .. "groups", base .. "g:"
    local stale = redis.pcall("ZRANGEBYSCORE", sets, "-inf", ARGV[1])
    local problem = nil
    if stale.err then
        problem = "WRONGTYPE " .. sets .. " is not a zset"
    elseif #stale > 0 then
        problem = bad(groups, "set")
        for _, setKey in ipairs(stale) do
            if problem then
                break
            end
            local cut = string.find(setKey, ":[^:]*$")
            if not cut or string.sub(setKey, 1, #gprefix) ~= gprefix or cut <= #gprefix then
                problem = sets .. " holds " .. setKey .. ", not an aggregation set of a group of this queue"
            else
                problem = bad(setKey, "zset") or bad(string.sub(setKey, 1, cut - 1), "zset")
            end
        end
    end
    if problem then
        problems[#problems + 1] = problem
    else
        for _, setKey in ipairs(stale) do
            local cut = string.find(setKey, ":[^:]*$")
            local groupKey = string.sub(setKey, 1, cut - 1)
            local res = redis.call("ZRANGE", setKey, 0, -1, "WITHSCORES")
            for i = 1, #res - 1, 2 do
                redis.call("ZADD", groupKey, tonumber(res[i + 1]), res[i])
            end
            redis.call("DEL", setKey)
            if #res > 0 then
                redis.call("SADD", groups, string.sub(groupKey, #gprefix + 1))
            end
        end
        if #stale > 0 then
            redis.call("ZREMRANGEBYSCORE", sets, "-inf", ARGV[1])
        end
    end
end
local first = NAMES + 1
while first <= #ARGV do
    local last = math.min(#ARGV, first + CHUNK - 1)
    local sets = {}
    for q = first, last do
        sets[#sets + 1] = "asynq:{" .. ARGV[q] .. "}:aggregation_sets"
    end
    if redis.call("EXISTS", unpack(sets)) > 0 then
        for q = first, last do
            reclaim_queue(ARGV[q])
        end
    end
    first = last + 1
end
if #problems > 0 then
    return problems
end
return redis.status_reply("OK")

-- Inspector: daily processed/failed counters (asynq HistoricalStats).
-- KEYS: pairs of processed:<day>, failed:<day>, today first.
-- Returns one value per key as a string ("0" when missing).
local res = {}
for _, key in ipairs(KEYS) do
    table.insert(res, redis.call("GET", key) or "0")
end
return res

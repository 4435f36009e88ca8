-- asyncq workflows: a member deleted or archived by hand (Inspector, CLI, web UI)
-- resolves as failed, as if its worker had archived it. Uses advance()
-- (workflow_advance.lua, prepended when loaded).
-- KEYS[1] workflow hash   KEYS[2] the member's task key
-- ARGV[1] stage   ARGV[2] member index   ARGV[3] reason   ARGV[4] now (unix s)
-- ARGV[5] now (unix ns)
-- Does nothing while the task still exists in a state other than archived.
local ts = redis.call("HGET", KEYS[2], "state")
if ts and ts ~= "archived" then
    return "alive"
end
return advance(KEYS[1], ARGV[1], ARGV[2], false, false, ARGV[3], ARGV[4], ARGV[5])

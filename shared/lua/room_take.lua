-- Take one room for a tenant waiting below its share (worker/jobs/room.py): at most as many rooms in
-- flight, fleet-wide, as the tenant has jobs queued. KEYS: the tenant's room counter (keys.room).
-- ARGV: its jobs queued now, the counter's life (ms; every take renews it). Returns 1 (taken) or 0.
-- A claim of one of the tenant's jobs gives one back (job_claim.lua), whichever slot it took.
local made = tonumber(redis.call('GET', KEYS[1]) or '0')
if made >= tonumber(ARGV[1]) then return 0 end
redis.call('INCR', KEYS[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1

-- Take one room for a tenant waiting below its share (worker/jobs/room.py): at most as many rooms in
-- flight, fleet-wide, as the tenant has interactive jobs queued now. KEYS: the tenant's room counter
-- (keys.room), then the tenants' queued counts (keys.fair_queued) of the model's lists other than the
-- batch lane. ARGV: the tenant, the counter's life (ms; every take renews it). Returns 1 (taken) or 0.
-- The queued jobs are counted here, in the same step as the take: a count read before, by the caller,
-- can be stale by the time it takes (a claim of the job meanwhile gave its room back: job_claim.lua).
-- A claim of one of the tenant's interactive jobs gives one back (job_claim.lua), whichever slot it took.
local queued = 0
for i = 2, #KEYS do
  queued = queued + tonumber(redis.call('HGET', KEYS[i], ARGV[1]) or '0')
end
local made = tonumber(redis.call('GET', KEYS[1]) or '0')
if made >= queued then return 0 end
redis.call('INCR', KEYS[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1

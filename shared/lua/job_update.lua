-- Set fields of an existing record only (an expired one is not brought back as a partial hash).
-- KEYS: job hash. ARGV: field, value, ... Returns 1 (set) or 0 (no record).
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1

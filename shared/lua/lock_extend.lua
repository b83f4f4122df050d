-- Extend a lock while `holder` holds it. KEYS: lock. ARGV: holder, ttl ms. Returns 1 or 0.
if held(KEYS[1], ARGV[1]) then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0

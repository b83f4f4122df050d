-- Delete a lock (or an idempotency key) only while `holder` still holds it.
-- KEYS: lock. ARGV: holder. Returns 1 (deleted) or 0.
if held(KEYS[1], ARGV[1]) then return redis.call('DEL', KEYS[1]) end
return 0

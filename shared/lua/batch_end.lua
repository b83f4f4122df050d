-- End a batch: its record, its working keys gone, out of the active set.
-- KEYS: lease, batch, lines, running, results, active set. ARGV: holder, record JSON, batch id.
-- -1: not the holder's.
if not held(KEYS[1], ARGV[1]) then return -1 end
redis.call('HSET', KEYS[2], 'record', ARGV[2])
redis.call('DEL', KEYS[3], KEYS[4], KEYS[5], KEYS[1])
redis.call('SREM', KEYS[6], ARGV[3])
return 1

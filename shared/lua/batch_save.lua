-- Store a batch's record. KEYS: lease, batch. ARGV: holder, record JSON. -1: not the holder's.
if not held(KEYS[1], ARGV[1]) then return -1 end
redis.call('HSET', KEYS[2], 'record', ARGV[2])
return 1

-- Give a batch's lease up. KEYS: lease. ARGV: holder. -1: not the holder's.
if not held(KEYS[1], ARGV[1]) then return -1 end
return redis.call('DEL', KEYS[1])

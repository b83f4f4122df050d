-- Take or renew a batch's lease. KEYS: lease. ARGV: holder, ms. 1: held by the holder, 0: someone else's.
local v = redis.call('GET', KEYS[1])
if not v then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end
if v == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
return 0

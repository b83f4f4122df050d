-- Store a line's answer once (0: it had one): counted once, however often a runner gets here.
-- KEYS: lease, results, running, batch, stats. ARGV: holder, line index, output line, counter
-- (ok|err), stats field. -1: not the holder's.
if not held(KEYS[1], ARGV[1]) then return -1 end
redis.call('HDEL', KEYS[3], ARGV[2])
if tonumber(redis.call('HGET', KEYS[4], 'next') or '0') <= tonumber(ARGV[2]) then
  redis.call('HSET', KEYS[4], 'next', tonumber(ARGV[2]) + 1)
end
if redis.call('HSETNX', KEYS[2], ARGV[2], ARGV[3]) == 0 then return 0 end
redis.call('HINCRBY', KEYS[4], ARGV[4], 1)
redis.call('HINCRBY', KEYS[5], ARGV[5], 1)
return 1

-- A line's jobs are queued. KEYS: lease, running, batch. ARGV: holder, line index, entry JSON.
-- -1: not the holder's.
if not held(KEYS[1], ARGV[1]) then return -1 end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
if tonumber(redis.call('HGET', KEYS[3], 'next') or '0') <= tonumber(ARGV[2]) then
  redis.call('HSET', KEYS[3], 'next', tonumber(ARGV[2]) + 1)
end
return 1

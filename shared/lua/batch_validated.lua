-- The lines, written to the staged key first, become the batch's (none: an empty batch).
-- KEYS: lease, batch, lines, staged lines. ARGV: holder, record JSON. -1: not the holder's.
if not held(KEYS[1], ARGV[1]) then redis.call('DEL', KEYS[4]) return -1 end
redis.call('DEL', KEYS[3])
if redis.call('EXISTS', KEYS[4]) == 1 then redis.call('RENAME', KEYS[4], KEYS[3]) end
redis.call('HSET', KEYS[2], 'record', ARGV[2], 'next', 0)
return 1

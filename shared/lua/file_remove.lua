-- Remove a file's record (once, however many callers race) and give its bytes back to its owner.
-- KEYS: the file's hash, the owner's listing, the expiring zset, the owner's stored-bytes counter.
-- ARGV: the file id. Returns 1 (removed here) or 0 (already gone).
local size = redis.call('HGET', KEYS[1], 'size')
if redis.call('DEL', KEYS[1]) == 0 then return 0 end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
if size then
  local left = redis.call('DECRBY', KEYS[4], size)
  if left <= 0 then redis.call('DEL', KEYS[4]) end
end
return 1

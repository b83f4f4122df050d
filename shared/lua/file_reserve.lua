-- Count a new file's bytes against its owner's quota, or refuse it.
-- KEYS: the owner's stored-bytes counter. ARGV: the file's bytes, the quota (0: none).
-- Returns -1 (counted) or the bytes the owner already stores (refused: nothing counted).
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
local quota = tonumber(ARGV[2])
if quota > 0 and used + tonumber(ARGV[1]) > quota then return used end
redis.call('INCRBY', KEYS[1], ARGV[1])
return -1

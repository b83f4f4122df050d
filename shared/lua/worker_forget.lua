-- Forget a worker whose job set is empty and whose last beat is no later than ARGV[2].
-- KEYS: the model's workers zset, the worker's job set. ARGV: worker id, latest beat to forget
-- ('': any). Returns 1 (forgotten) or 0.
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
local seen = redis.call('ZSCORE', KEYS[1], ARGV[1])
if ARGV[2] ~= '' and seen and tonumber(seen) > tonumber(ARGV[2]) then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
return 1

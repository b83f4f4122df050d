-- Keep a job in its worker's job set while that attempt still runs it (a worker that was reaped
-- re-lists the jobs still its own). KEYS: job hash, worker's job set. ARGV: worker id (JSON),
-- attempt, job id. Returns 1 (still its own, listed) or 0.
if redis.call('HGET', KEYS[1], 'status') ~= STATUS.running then return 0 end
if redis.call('HGET', KEYS[1], 'worker') ~= ARGV[1] then return 0 end
if redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[2] then return 0 end
redis.call('SADD', KEYS[2], ARGV[3])
return 1

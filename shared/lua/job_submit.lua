-- A job's record and its Celery message together, or neither.
-- KEYS: job hash, queued zset, stats, the message's list, then every list of the model's queue, then
-- each list's zset of cancelled jobs whose message is still in it (same order).
-- ARGV: most jobs the queue may hold ('' : no limit), ttl, job id, created_at, stats field, the
-- message ('': none), then the record's fields and values. Returns the queue's depth when it is
-- full, -2 when a message comes with a job that already exists (a job is queued once: its record
-- is never overwritten), else -1.
-- The depth counts the jobs really queued: each list's length less its cancelled jobs (their
-- messages wait there for a worker to pop and skip them; job_cancel.lua, job_claim.lua). Cancels
-- older than ttl are trimmed, and an empty list holds no cancelled job's message.
if ARGV[6] ~= '' and redis.call('EXISTS', KEYS[1]) == 1 then return -2 end
if ARGV[1] ~= '' then
  local depth, lists = 0, (#KEYS - 4) / 2
  for i = 5, 4 + lists do
    local n, cancelled = redis.call('LLEN', KEYS[i]), KEYS[i + lists]
    if n == 0 then
      redis.call('DEL', cancelled)
    else
      redis.call('ZREMRANGEBYSCORE', cancelled, '-inf', tonumber(ARGV[4]) - tonumber(ARGV[2]))
      depth = depth + math.max(0, n - redis.call('ZCARD', cancelled))
    end
  end
  if depth >= tonumber(ARGV[1]) then return depth end
end
redis.call('HSET', KEYS[1], unpack(ARGV, 7))
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[3])
redis.call('HINCRBY', KEYS[3], ARGV[5], 1)
if ARGV[6] ~= '' then redis.call('LPUSH', KEYS[4], ARGV[6]) end
return -1

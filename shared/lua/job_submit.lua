-- A job's record and its Celery message together, or neither.
-- KEYS: job hash, queued zset, stats, the message's list, then every list of the model's queue, then
-- each list's zset of cancelled jobs whose message is still in it (same order).
-- ARGV: most jobs the queue may hold ('' : no limit), ttl, job id, created_at, stats field, the
-- message ('': none), the job's fair share ('': none; JSON, below), then the record's fields and
-- values. Returns the queue's depth when it is full, -2 when a message comes with a job that
-- already exists (a job is queued once: its record is never overwritten), else -1.
-- The depth counts the jobs really queued: each list's length less its cancelled jobs (their
-- messages wait there for a worker to pop and skip them; job_cancel.lua, job_claim.lua). Cancels
-- older than ttl are trimmed, and an empty list holds no cancelled job's message.
--
-- Fair share (shared/fairshare.py): the share is {b: tenant, w: weight, c: cost in tokens, o: 1 to
-- order, z: the list's tag zset, s: its state hash, n: its queued-per-tenant hash}. Ordered, the
-- job's virtual finish tag is max(virtual time, the tenant's last tag) + cost / weight, and its
-- message goes into the list behind (nearer the popping end than) every message with a larger tag:
-- workers pop the right end, so the list stays in tag order and the next job popped is the one of
-- the tenant with the least service. The virtual time is the tag of the job claimed last
-- (job_claim.lua): a tenant that was idle starts level with the others, not with credit.
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
local list, msg, fair = KEYS[4], ARGV[6], nil
if ARGV[7] ~= '' then fair = cjson.decode(ARGV[7]) end
redis.call('HSET', KEYS[1], unpack(ARGV, 8))
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[3])
redis.call('HINCRBY', KEYS[3], ARGV[5], 1)
if msg ~= '' and fair and fair.o == 1 then
  local len = redis.call('LLEN', list)
  if len == 0 then redis.call('DEL', fair.z) end  -- what it held has left the list
  local v = tonumber(redis.call('HGET', fair.s, 'v') or '0')
  local last = tonumber(redis.call('HGET', fair.s, 't|' .. fair.b) or '0')
  local tag = tagstr(math.max(v, last) + fair.c / fair.w)
  local later = redis.call('ZCOUNT', fair.z, '(' .. tag, '+inf')
  if later == 0 then
    redis.call('LPUSH', list, msg)
  elseif later >= len then
    redis.call('RPUSH', list, msg)
  else
    redis.call('LINSERT', list, 'AFTER', redis.call('LINDEX', list, later - 1), msg)
  end
  redis.call('ZADD', fair.z, tag, ARGV[3])
  redis.call('HSET', fair.s, 't|' .. fair.b, tag)
  redis.call('EXPIRE', fair.z, ARGV[2])
  redis.call('EXPIRE', fair.s, ARGV[2])
  fair.t = tag
elseif msg ~= '' then
  redis.call('LPUSH', list, msg)
end
if fair then
  redis.call('HSET', KEYS[1], 'fair', cjson.encode(fair), 'fair_q', '1')
  redis.call('HINCRBY', fair.n, fair.b, 1)
  redis.call('EXPIRE', fair.n, ARGV[2])
end
return -1

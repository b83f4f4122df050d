-- A job's record and its Celery message together, or neither.
-- KEYS: job hash, queued zset, stats, the message's list, that list's keys (its fair share's tag order,
-- state and tenants' queued counts, its cancelled jobs' zset: list_keys in shared/store.py), then every
-- list of the model's queue, then each list's zset of cancelled jobs whose message is still in it.
-- ARGV: most jobs the queue may hold ('' : no limit), ttl, job id, created_at, stats field, the
-- message ('': none), the job's fair share ('': none; FairShare JSON, below), the farthest from an end
-- of the list a message is placed (messages), the channel the job is announced on while its tenant has
-- few jobs queued (ANNOUNCE_QUEUED or fewer: a tenant that may run below its share; '': none, a batch
-- job's: worker/jobs/room.py), then the record's fields and values. Returns the queue's depth when it is full, -2 when a message comes with a job that
-- already exists (a job is queued once: its record is never overwritten), else -1.
-- The depth counts the jobs really queued: each list's length less its cancelled jobs (their
-- messages wait there for a worker to pop and skip them; job_cancel.lua, job_claim.lua). Cancels
-- older than ttl are trimmed, and an empty list holds no cancelled job's message.
--
-- Fair share (shared/fairshare.py): the share is {tenant, weight, cost in tokens, ordered}.
-- Ordered, the job's virtual finish tag is max(virtual time, the tenant's last tag) + cost / weight, and
-- its message goes into the list behind (nearer the popping end than) every message with a larger tag:
-- workers pop the right end, so the list stays in tag order and the next job popped is the one of
-- the tenant with the least service. The virtual time is the tag of the job claimed last
-- (job_claim.lua): a tenant that was idle starts level with the others, not with credit.
-- Placing walks the list from its nearer end: from the pushing end (LINSERT after the message there),
-- or from the popping end (the messages ahead of it are lifted off, and put back on after it). A
-- message whose place is farther than ARGV[8] from both ends goes ARGV[8] from the nearer one: the cost
-- of a submit is bounded, whatever the depth; only in a list longer than twice that may a job run that
-- many places away from its tag order.
local ANNOUNCE_QUEUED = 8  -- a tenant with more queued is backlogged: the workers' periodic check covers it
if ARGV[6] ~= '' and redis.call('EXISTS', KEYS[1]) == 1 then return -2 end
if ARGV[1] ~= '' then
  local depth, lists = 0, (#KEYS - 8) / 2
  for i = 9, 8 + lists do
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
local fk = list_keys(5, fair)
redis.call('HSET', KEYS[1], unpack(ARGV, 10))
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[3])
redis.call('HINCRBY', KEYS[3], ARGV[5], 1)
if msg ~= '' and fair and fair.ordered then
  local len = redis.call('LLEN', list)
  if len == 0 then redis.call('DEL', fk.order) end  -- what it held has left the list
  local v = tonumber(redis.call('HGET', fk.state, 'v') or '0')
  local last = tonumber(redis.call('HGET', fk.state, 't|' .. fair.tenant) or '0')
  local tag = tagstr(math.max(v, last) + fair.cost / fair.weight)
  -- `later` messages have a larger tag (they stay behind it), the `ahead` others go before it
  local later = redis.call('ZCOUNT', fk.order, '(' .. tag, '+inf')
  local ahead, walk = math.max(0, len - later), tonumber(ARGV[8])
  if later == 0 then
    redis.call('LPUSH', list, msg)
  elseif ahead == 0 then
    redis.call('RPUSH', list, msg)
  elseif ahead <= later then
    local lifted = redis.call('RPOP', list, math.min(ahead, walk))  -- the popping end's first, in order
    redis.call('RPUSH', list, msg)
    for i = #lifted, 1, -256 do
      redis.call('RPUSH', list, unpack(reversed(lifted, i, math.max(1, i - 255))))
    end
  else
    redis.call('LINSERT', list, 'AFTER', redis.call('LINDEX', list, math.min(later, walk) - 1), msg)
  end
  redis.call('ZADD', fk.order, tag, ARGV[3])
  redis.call('HSET', fk.state, 't|' .. fair.tenant, tag)
  redis.call('EXPIRE', fk.order, ARGV[2])
  redis.call('EXPIRE', fk.state, ARGV[2])
  fair.tag = tag
elseif msg ~= '' then
  redis.call('LPUSH', list, msg)
end
if fair then
  redis.call('HSET', KEYS[1], 'fair', cjson.encode(fair), 'fair_q', '1')
  local waiting = redis.call('HINCRBY', fk.queued, fair.tenant, 1)
  redis.call('EXPIRE', fk.queued, ARGV[2])
  redis.call('HSET', fk.state, 'w|' .. fair.tenant, fair.weight)  -- what the workers weigh its share by
  redis.call('EXPIRE', fk.state, ARGV[2])
  if waiting <= ANNOUNCE_QUEUED and ARGV[9] ~= '' then
    redis.call('PUBLISH', ARGV[9], cjson.encode({tenant = fair.tenant, weight = fair.weight}))
  end
end
return -1

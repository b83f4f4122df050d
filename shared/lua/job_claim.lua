-- queued -> running, attempt + 1.
-- KEYS: job hash, log, worker's job set, queued zset, then the keys of the list the job was queued on
-- (list_keys in shared/store.py: its fair share's three and its cancelled jobs' zset), then (optional)
-- its tenant's room counter (room_take.lua: a claim of a tenant's job uses up one room made for it). ARGV: worker id (JSON), now,
-- job id, claim token ('' : none), ttl. Returns {status before (JSON), attempt, last seq in the log,
-- the progress a paused job kept (its record's `resume`, job_requeue.lua) or nil}. The same token
-- again (a retry whose first call took the job but whose answer was lost) gets the same answer,
-- not "running": else the job would stay running with nobody on it.
-- Every claim consumes one of the job's messages: a job cancelled while queued is no longer among
-- those whose message waits in its queue's list (the zset the record names, see job_cancel.lua).
-- A job of a fair share leaves its list's tag order and its tenant's queued count (job_submit.lua).
-- A job taken gets a full ttl for its record and log (the heartbeat renews them while it runs).
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return nil end
local fair = fair_of(KEYS[1])
local fk = list_keys(5, fair)
local cancelled = waits_in(KEYS[1], fk)
if cancelled then redis.call('ZREM', cancelled, ARGV[3]) end
-- its message has left the list: the list's virtual time moves on to its tag (job_submit.lua)
if fair and fair.tag and redis.call('ZREM', fk.order, ARGV[3]) == 1 then
  local v = redis.call('HGET', fk.state, 'v')
  if not v or tonumber(fair.tag) > tonumber(v) then redis.call('HSET', fk.state, 'v', fair.tag) end
end
if st ~= STATUS.queued then
  if ARGV[4] ~= '' and st == STATUS.running and redis.call('HGET', KEYS[1], 'claim') == ARGV[4] then
    return {STATUS.queued, tonumber(redis.call('HGET', KEYS[1], 'attempt')), last_seq(KEYS[2]),
            redis.call('HGET', KEYS[1], 'resume')}
  end
  return {st, 0, 0}
end
local attempt = tonumber(redis.call('HGET', KEYS[1], 'attempt') or '0') + 1
redis.call('HSET', KEYS[1], 'status', STATUS.running, 'worker', ARGV[1], 'started_at', ARGV[2],
           'attempt', attempt, 'claim', ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[5])
redis.call('EXPIRE', KEYS[2], ARGV[5])
redis.call('SADD', KEYS[3], ARGV[3])
redis.call('ZREM', KEYS[4], ARGV[3])
fair_unqueue(KEYS[1], fair, fk)
if KEYS[9] and tonumber(redis.call('GET', KEYS[9]) or '0') > 0 then redis.call('DECR', KEYS[9]) end
return {st, attempt, last_seq(KEYS[2]), redis.call('HGET', KEYS[1], 'resume')}

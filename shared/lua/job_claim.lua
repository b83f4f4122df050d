-- queued -> running, attempt + 1.
-- KEYS: job hash, log, worker's job set, queued zset. ARGV: worker id (JSON), now, job id, claim
-- token ('' : none). Returns {status before (JSON), attempt, last seq in the log}. The same token
-- again (a retry whose first call took the job but whose answer was lost) gets the same answer,
-- not "running": else the job would stay running with nobody on it.
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return nil end
if st ~= STATUS.queued then
  if ARGV[4] ~= '' and st == STATUS.running and redis.call('HGET', KEYS[1], 'claim') == ARGV[4] then
    return {STATUS.queued, tonumber(redis.call('HGET', KEYS[1], 'attempt')), last_seq(KEYS[2])}
  end
  return {st, 0, 0}
end
local attempt = tonumber(redis.call('HGET', KEYS[1], 'attempt') or '0') + 1
redis.call('HSET', KEYS[1], 'status', STATUS.running, 'worker', ARGV[1], 'started_at', ARGV[2],
           'attempt', attempt, 'claim', ARGV[4])
redis.call('SADD', KEYS[3], ARGV[3])
redis.call('ZREM', KEYS[4], ARGV[3])
return {st, attempt, last_seq(KEYS[2])}

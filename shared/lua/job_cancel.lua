-- Cancel: queued -> cancelled at once (with its final event); running -> flag it; else nothing.
-- KEYS: job hash, log, channel, queued zset, stats. ARGV: now, job id, ttl, the final event (JSON).
-- Returns the status before (JSON).
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return nil end
if st == STATUS.queued then
  redis.call('HSET', KEYS[1], 'status', STATUS.cancelled, 'finished_at', ARGV[1],
             'finish_reason', cjson.encode('cancelled'))
  log_event(KEYS[1], KEYS[2], KEYS[3], event(ARGV[4], last_seq(KEYS[2]) + 1), ARGV[3])
  redis.call('ZREM', KEYS[4], ARGV[2])
  count(KEYS[5], KEYS[1], 'end', 'cancelled', '')
elseif st == STATUS.running then
  redis.call('HSET', KEYS[1], 'cancel_requested', 'true')
end
return st

-- queued -> failed with its final `error` event (a job no worker can run); else nothing.
-- KEYS: job hash, log, channel, queued zset, stats. ARGV: now, job id, the error event (JSON), ttl.
-- Returns 1 (failed) or 0.
if redis.call('HGET', KEYS[1], 'status') ~= STATUS.queued then return 0 end
local ev = event(ARGV[3], last_seq(KEYS[2]) + 1)
redis.call('HSET', KEYS[1], 'status', STATUS.failed, 'finished_at', ARGV[1], 'error', cjson.encode(ev.error))
log_event(KEYS[1], KEYS[2], KEYS[3], ev, ARGV[4])
redis.call('ZREM', KEYS[4], ARGV[2])
local fair = fair_of(KEYS[1])
if fair_unqueue(KEYS[1], fair) then fair_refund(fair, fair.c) end
count(KEYS[5], KEYS[1], 'end', 'failed', ev.error.code)
return 1

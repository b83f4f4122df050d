-- queued -> failed with its final `error` event (a job no worker can run; one past its deadline);
-- else nothing. KEYS: job hash, log, channel, queued zset, stats, then the keys of the list the job was
-- queued on (list_keys in shared/store.py). ARGV: now, job id, the error event
-- (JSON), ttl, '1' if the job's message still waits in its queue's list ('' : none). Returns 1
-- (failed) or 0. A message that still waits is counted out of the queue's depth as a cancelled
-- job's is (job_cancel.lua): the zset the record names, which a claim takes it out of.
if redis.call('HGET', KEYS[1], 'status') ~= STATUS.queued then return 0 end
local ev = event(ARGV[3], last_seq(KEYS[2]) + 1)
redis.call('HSET', KEYS[1], 'status', STATUS.failed, 'finished_at', ARGV[1], 'error', cjson.encode(ev.error))
log_event(KEYS[1], KEYS[2], KEYS[3], ev, ARGV[4])
redis.call('ZREM', KEYS[4], ARGV[2])
local fair = fair_of(KEYS[1])
local fk = list_keys(6, fair)
if fair_unqueue(KEYS[1], fair, fk) then fair_refund(fair, fk, fair.cost) end
count(KEYS[5], KEYS[1], 'end', 'failed', ev.error.code)
local waits = waits_in(KEYS[1], fk)
if ARGV[5] == '1' and waits then
  redis.call('ZADD', waits, ARGV[1], ARGV[2])
  redis.call('EXPIRE', waits, ARGV[4])
end
return 1

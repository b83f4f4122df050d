-- Cancel: queued -> cancelled at once (with its final event); running -> flag it; else nothing.
-- KEYS: job hash, log, channel, queued zset, stats, then the keys of the list the job was queued on
-- (list_keys in shared/store.py). ARGV: now, job id, ttl, the final event (JSON).
-- Returns the status before (JSON).
-- A queued job's message stays in its queue's list until a worker pops it (its claim then finds the
-- job cancelled): the job goes into the zset the record names (`queue_cancelled`, written at submit,
-- one per list), which job_submit.lua and the queue metrics subtract from the list's length. A
-- claim takes it out; entries older than ttl are trimmed here (the zset lives ttl after its last one).
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return nil end
if st == STATUS.queued then
  redis.call('HSET', KEYS[1], 'status', STATUS.cancelled, 'finished_at', ARGV[1],
             'finish_reason', cjson.encode('cancelled'))
  local kept = redis.call('HGET', KEYS[1], 'resume')  -- a paused job: its record keeps the text its stream carried
  if kept then
    redis.call('HSET', KEYS[1], 'choices',
               cjson.encode({{index = 0, finish_reason = 'cancelled', text = cjson.decode(kept).text}}))
  end
  log_event(KEYS[1], KEYS[2], KEYS[3], event(ARGV[4], last_seq(KEYS[2]) + 1), ARGV[3])
  redis.call('ZREM', KEYS[4], ARGV[2])
  local fair = fair_of(KEYS[1])
  local fk = list_keys(6, fair)
  if fair_unqueue(KEYS[1], fair, fk) then fair_refund(fair, fk, fair.cost) end
  count(KEYS[5], KEYS[1], 'end', 'cancelled', '')
  local cancelled = waits_in(KEYS[1], fk)
  if cancelled then
    redis.call('ZADD', cancelled, ARGV[1], ARGV[2])
    redis.call('ZREMRANGEBYSCORE', cancelled, '-inf', tonumber(ARGV[1]) - tonumber(ARGV[3]))
    redis.call('EXPIRE', cancelled, ARGV[3])
  end
elseif st == STATUS.running then
  redis.call('HSET', KEYS[1], 'cancel_requested', 'true')
end
return st

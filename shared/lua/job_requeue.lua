-- Take a running job back from a worker that died, drains or lost its engine: cancelled if a cancel
-- was pending, failed after max attempts, else queued again with a `restart` event.
-- KEYS: job hash, log, channel, worker's job set, queued zset, the model's live workers zset (or
-- any key), stats, unsent zset. ARGV: worker id (JSON) or '', attempt or '', max attempts, now, reason, job id,
-- ttl, claimed before ('' = any time), the worker's last beat as the caller saw it ('' = don't
-- check), worker id, then the three events the caller made (JSON): cancelled, given up (its
-- message's {attempt} filled here), restart; then the engine deaths a job may be running at before
-- it is failed instead (reason 'engine_failure': the count is the record's `engine_failures`) and
-- the event that fails it then, then the progress it keeps (a Resume, JSON; '' : none). Returns 'requeued', 'failed', 'cancelled', 'skip' or 'alive'.
-- The job leaves the worker's set only when it is handed back, or when it is not that worker's
-- running job at all (a stale entry); a newer attempt of the same worker, or a job it claimed after
-- the caller looked (`started_at` above ARGV[8]), stays. A reaper passes the beat it judged
-- (ARGV[9]): if the worker has beaten since, nothing changes and the answer is 'alive'.
-- A job preempted (reason 'preempted': its tenant ran more than its share while another waited,
-- worker/jobs/room.py) is queued again whatever its attempts: its attempts counted against max
-- attempts are those that were not preempted (the record's `preemptions`). So is a job handed back as
-- its model went to sleep on a multi-model worker (reason 'model_swap'): no fault of its run.
-- A job queued again with its progress kept (ARGV[16]: a worker that paused it to make room,
-- worker/jobs/resume.py) logs no `restart`: its next attempt continues the stream from the record's
-- `resume`. Any other requeue drops a `resume` left from before: the `restart` starts over.
-- A job queued again is also marked unsent (KEYS[8]) until its caller has sent its new message:
-- a message that could not be sent (or a caller that died first) is the reaper's to send.
if ARGV[9] ~= '' then
  local seen = redis.call('ZSCORE', KEYS[6], ARGV[10])
  if seen and tonumber(seen) > tonumber(ARGV[9]) then return 'alive' end
end
local st = redis.call('HGET', KEYS[1], 'status')
if ARGV[1] ~= '' and (st ~= STATUS.running or redis.call('HGET', KEYS[1], 'worker') ~= ARGV[1]) then
  redis.call('SREM', KEYS[4], ARGV[6])
  return 'skip'
end
if st ~= STATUS.running then return 'skip' end
if ARGV[2] ~= '' and redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[2] then return 'skip' end
if ARGV[8] ~= '' and tonumber(redis.call('HGET', KEYS[1], 'started_at') or '0') > tonumber(ARGV[8]) then
  return 'skip'
end
redis.call('SREM', KEYS[4], ARGV[6])
local attempt = tonumber(redis.call('HGET', KEYS[1], 'attempt') or '0')
local seq = last_seq(KEYS[2]) + 1
local ev, outcome
if redis.call('HGET', KEYS[1], 'cancel_requested') == 'true' then
  ev = event(ARGV[11], seq)
  redis.call('HSET', KEYS[1], 'status', STATUS.cancelled, 'finished_at', ARGV[4],
             'finish_reason', cjson.encode('cancelled'))
  outcome = 'cancelled'
  count(KEYS[7], KEYS[1], 'end', 'cancelled', '')
elseif ARGV[5] == 'engine_failure'
    and redis.call('HINCRBY', KEYS[1], 'engine_failures', 1) >= tonumber(ARGV[14]) then
  ev = event(ARGV[15], seq)
  redis.call('HSET', KEYS[1], 'status', STATUS.failed, 'finished_at', ARGV[4], 'error', cjson.encode(ev.error))
  outcome = 'failed'
  count(KEYS[7], KEYS[1], 'end', 'failed', ev.error.code)
elseif attempt - tonumber(redis.call('HGET', KEYS[1], 'preemptions') or '0') >= tonumber(ARGV[3]) then
  ev = event(ARGV[12], seq, {attempt = attempt})
  redis.call('HSET', KEYS[1], 'status', STATUS.failed, 'finished_at', ARGV[4], 'error', cjson.encode(ev.error))
  outcome = 'failed'
  count(KEYS[7], KEYS[1], 'end', 'failed', ev.error.code)
else
  if ARGV[16] ~= '' then
    redis.call('HSET', KEYS[1], 'resume', ARGV[16])
  else
    ev = event(ARGV[13], seq)
    ev.attempt = attempt
    redis.call('HDEL', KEYS[1], 'resume')
  end
  redis.call('HSET', KEYS[1], 'status', STATUS.queued)
  redis.call('ZADD', KEYS[5], ARGV[4], ARGV[6])
  redis.call('ZADD', KEYS[8], ARGV[4], ARGV[6])
  redis.call('HDEL', KEYS[1], 'worker')
  if ARGV[5] == 'preempted' or ARGV[5] == 'model_swap' then redis.call('HINCRBY', KEYS[1], 'preemptions', 1) end
  outcome = 'requeued'
  count(KEYS[7], KEYS[1], 'requeue', ARGV[5])
end
if ev then log_event(KEYS[1], KEYS[2], KEYS[3], ev, ARGV[7]) end
if outcome == 'requeued' then  -- queued again: its record lives until its deadline and a ttl after it
  local deadline = tonumber(redis.call('HGET', KEYS[1], 'deadline') or '')
  if deadline then
    local keep = math.ceil(deadline - tonumber(ARGV[4])) + tonumber(ARGV[7])
    if keep > tonumber(ARGV[7]) then redis.call('EXPIRE', KEYS[1], keep) end
  end
end
return outcome

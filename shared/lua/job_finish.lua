-- Write a job's end (terminal fields + final event), only while this attempt owns the running job:
-- a worker that lost the job is fenced out. The end check: the final event must directly follow
-- the last logged one, i.e. the log holds every event the attempt wrote; if not, its stream would
-- not replay to its text, so the job ends failed with the caller's log_incomplete event instead.
-- KEYS: job hash, worker's job set, log, channel, stats, then the keys of the list the job was queued
-- on (list_keys in shared/store.py). ARGV: attempt, job id, final event seq
-- ('': right after the last logged event), final event JSON, ttl, the log_incomplete event (JSON;
-- {last} and {wrote} in its message), field, value, ... Returns 0 (fenced out), 1 (written) or
-- 2 (log_incomplete). The end is counted by status (a failure for the client's input, an
-- invalid_request_error, as 'invalid': the record still says failed) and error code.
if redis.call('HGET', KEYS[1], 'status') ~= STATUS.running then return 0 end
if redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[1] then return 0 end
local last = last_seq(KEYS[3])
local seq, data, result = last + 1, ARGV[4], 1
redis.call('HSET', KEYS[1], unpack(ARGV, 7))
if ARGV[3] == '' then
  data = string.gsub(data, '"seq":%d+', '"seq":' .. seq, 1)
elseif tonumber(ARGV[3]) ~= seq then
  local ev = event(ARGV[6], seq, {last = last, wrote = tonumber(ARGV[3]) - 1})
  data = cjson.encode(ev)
  redis.call('HSET', KEYS[1], 'status', STATUS.failed, 'error', cjson.encode(ev.error))
  result = 2
end
local st, code = redis.call('HGET', KEYS[1], 'status'), ''
local label = cjson.decode(st)
local e = redis.call('HGET', KEYS[1], 'error')
if st == STATUS.failed and e and e ~= 'null' then
  e = cjson.decode(e)
  code = e.code
  -- the worker refused the client's input: counted apart from the service's own failures
  if e.type == 'invalid_request_error' then label = 'invalid' end
end
count(KEYS[5], KEYS[1], 'end', label, code)
-- fair share: the tokens its tenant was served; a job that cost less than its tag assumed (its
-- prompt's tokens at the share's prompt_weight) gives the difference back to the tenant's last tag
-- (never below the virtual time)
local fair = fair_of(KEYS[1])
local fk = list_keys(6, fair)
if fair then
  local u, used, charged = redis.call('HGET', KEYS[1], 'usage'), 0, 0
  if u and u ~= 'null' then
    u = cjson.decode(u)
    used = (tonumber(u.prompt_tokens) or 0) + (tonumber(u.completion_tokens) or 0)
    charged = (tonumber(u.prompt_tokens) or 0) * (tonumber(fair.prompt_weight) or 1)
      + (tonumber(u.completion_tokens) or 0)
  end
  if used > 0 then count(KEYS[5], KEYS[1], 'served', fair.tenant, nil, used) end
  fair_refund(fair, fk, fair.cost - charged)
end
redis.call('SREM', KEYS[2], ARGV[2])
redis.call('XADD', KEYS[3], seq .. '-0', 'e', data)
redis.call('EXPIRE', KEYS[3], ARGV[5])
redis.call('EXPIRE', KEYS[1], ARGV[5])
redis.call('PUBLISH', KEYS[4], data)
return result

-- Helpers every script starts with (after the STATUS table the loader writes from JobStatus).

-- a value as a string ('' for nil and for anything else)
local function text(v)
  if type(v) == 'string' then return v end
  return ''
end

-- one of the cluster-wide counters (keys.stat): kind|model|a[|b], the model from the job record h;
-- counts `by` (default 1)
local function count(stats, h, kind, a, b, by)
  local m = redis.call('HGET', h, 'model')
  local f = kind .. '|' .. text(m and cjson.decode(m)) .. '|' .. text(a)
  if b then f = f .. '|' .. text(b) end
  redis.call('HINCRBY', stats, f, by or 1)
end

-- a virtual finish tag as stored (every digit of the double: tags are compared and added to)
local function tagstr(x)
  return string.format('%.17g', x)
end

-- the job's fair share (the record's `fair`, see job_submit.lua), or nil
local function fair_of(h)
  local f = redis.call('HGET', h, 'fair')
  if f then return cjson.decode(f) end
  return nil
end

-- a queued job of that share is no longer waiting (taken, cancelled or failed): it leaves its
-- tenant's count of queued jobs, once (`fair_q` is set at submit only); true if it was counted
local function fair_unqueue(h, fair)
  if fair and redis.call('HDEL', h, 'fair_q') == 1 then
    redis.call('HINCRBY', fair.n, fair.b, -1)
    return true
  end
  return false
end

-- give `tokens` of a job's charge back to its tenant (a job that cost less than charged, or never
-- ran): its last tag moves back by tokens / weight, never below the virtual time
local function fair_refund(fair, tokens)
  if not (fair and fair.t and tokens > 0) then return end
  local k = 't|' .. fair.b
  local last, v = redis.call('HGET', fair.s, k), redis.call('HGET', fair.s, 'v')
  if last then
    redis.call('HSET', fair.s, k, tagstr(math.max(tonumber(last) - tokens / fair.w, tonumber(v or '0'))))
  end
end

-- the seq of the last event in a job's log (0: none)
local function last_seq(log)
  local last = redis.call('XREVRANGE', log, '+', '-', 'COUNT', 1)
  if #last == 0 then return 0 end
  return tonumber(string.match(last[1][1], '^(%d+)'))
end

-- `template` with each {name} replaced by values[name] (an error message made by the caller)
local function fill(template, values)
  for name, value in pairs(values) do
    template = string.gsub(template, '{' .. name .. '}', (string.gsub(tostring(value), '%%', '%%%%')))
  end
  return template
end

-- an event the caller made (JSON), completed here: its seq, and its error message's {placeholders}
local function event(template, seq, values)
  local ev = cjson.decode(template)
  ev.seq = seq
  if ev.error and values then ev.error.message = fill(ev.error.message, values) end
  return ev
end

-- append an event to a job's log, refresh the job's TTL and publish it; returns its JSON
local function log_event(h, log, channel, ev, ttl)
  local data = cjson.encode(ev)
  redis.call('XADD', log, ev.seq .. '-0', 'e', data)
  redis.call('EXPIRE', log, ttl)
  redis.call('EXPIRE', h, ttl)
  redis.call('PUBLISH', channel, data)
  return data
end

-- whether `holder` holds the lease or lock `key`
local function held(key, holder)
  return redis.call('GET', key) == holder
end

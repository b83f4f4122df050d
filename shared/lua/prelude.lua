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

-- items[from], items[from - 1], ..., items[to] (from >= to) as a list
local function reversed(items, from, to)
  local out = {}
  for i = from, to, -1 do out[#out + 1] = items[i] end
  return out
end

-- a virtual finish tag as stored (every digit of the double: tags are compared and added to)
local function tagstr(x)
  return string.format('%.17g', x)
end

-- the job's fair share (the record's `fair`: shared/fairshare.py's FairShare), or nil (none, or one
-- written before the share had its full names: that job's share is not counted)
local function fair_of(h)
  local f = redis.call('HGET', h, 'fair')
  if not f then return nil end
  f = cjson.decode(f)
  if type(f) ~= 'table' or f.tenant == nil then return nil end
  return f
end

-- the keys of the list a job's message was queued on, as the script declares them from KEYS[i]
-- (list_keys in shared/store.py): the fair share's tag order, state and tenants' queued counts
-- (fair_keys in shared/fairshare.py), then the zset of the list's cancelled jobs. An error when the job
-- has a share and they were not declared: a script touches no key it was not given
local function list_keys(i, fair)
  if fair and not KEYS[i + 2] then error('fair share: the keys of the share were not declared') end
  return {order = KEYS[i], state = KEYS[i + 1], queued = KEYS[i + 2], cancelled = KEYS[i + 3]}
end

-- the zset of cancelled jobs of the list the job's message waits in, if it waits in one (the record's
-- `queue_cancelled`, written at submit, names it): the key declared for it, which must be that one
local function waits_in(h, lk)
  local named = redis.call('HGET', h, 'queue_cancelled')
  if not named then return nil end
  if named ~= lk.cancelled then error('the list of the job was not declared: ' .. tostring(lk.cancelled)) end
  return named
end

-- a queued job of that share is no longer waiting (taken, cancelled or failed): it leaves its
-- tenant's count of queued jobs, once (`fair_q` is set at submit only); true if it was counted
local function fair_unqueue(h, fair, fk)
  if fair and redis.call('HDEL', h, 'fair_q') == 1 then
    redis.call('HINCRBY', fk.queued, fair.tenant, -1)
    return true
  end
  return false
end

-- give `tokens` of a job's charge back to its tenant (a job that cost less than charged, or never
-- ran): its last tag moves back by tokens / weight, never below the virtual time
local function fair_refund(fair, fk, tokens)
  if not (fair and fair.tag and tokens > 0) then return end
  local k = 't|' .. fair.tenant
  local last, v = redis.call('HGET', fk.state, k), redis.call('HGET', fk.state, 'v')
  if last then
    redis.call('HSET', fk.state, k, tagstr(math.max(tonumber(last) - tokens / fair.weight, tonumber(v or '0'))))
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

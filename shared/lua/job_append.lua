-- Append many events (of many jobs) to their logs and channels in one call.
-- KEYS: per event its job hash, log and channel. ARGV: per event its attempt, seq, JSON, ttl ('' =
-- leave the TTL) and the job's first_token_at to record with it ('' = none). Per event 1 (written),
-- 0 (that attempt no longer owns the job) or an error text. An event that does not follow the last
-- logged one is refused: XADD refuses a seq already logged, and a seq past the next one is an error
-- (an earlier event was lost), so a log never has a hole.
local out = {}
for i = 0, #KEYS / 3 - 1 do
  local h, log, ch = KEYS[3 * i + 1], KEYS[3 * i + 2], KEYS[3 * i + 3]
  local attempt, seq, data, ttl, first = ARGV[5 * i + 1], ARGV[5 * i + 2], ARGV[5 * i + 3], ARGV[5 * i + 4],
    ARGV[5 * i + 5]
  local owner = redis.call('HMGET', h, 'status', 'attempt')
  if owner[1] ~= STATUS.running or owner[2] ~= attempt then
    out[i + 1] = 0
  else
    local last = last_seq(log)
    if tonumber(seq) > last + 1 then
      out[i + 1] = 'GAP event ' .. seq .. ' does not follow the last logged event ' .. last
    else
      local added = redis.pcall('XADD', log, seq .. '-0', 'e', data)
      if type(added) == 'table' and added.err then
        out[i + 1] = added.err
      else
        if ttl ~= '' then
          redis.call('EXPIRE', log, ttl)
          redis.call('EXPIRE', h, ttl)
        end
        if first ~= '' then
          redis.call('HSET', h, 'first_token_at', first)
        end
        redis.call('PUBLISH', ch, data)
        out[i + 1] = 1
      end
    end
  end
end
return out

-- Take one unfinished-job slot per new job id, within a limit; finished jobs (and ids whose record
-- never came, past a grace period) leave the set first.
-- KEYS: active zset. ARGV: limit, grace s, job key prefix, ttl, then the new job ids.
-- Returns -1 when admitted, else the number of unfinished jobs.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local terminal = {}
for _, s in pairs(STATUS_TERMINAL) do terminal[s] = true end
local rows = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for i = 1, #rows, 2 do
  local st = redis.call('HGET', ARGV[3] .. rows[i], 'status')
  if (st and terminal[st]) or (not st and tonumber(rows[i + 1]) < now - tonumber(ARGV[2])) then
    redis.call('ZREM', KEYS[1], rows[i])
  end
end
local n = redis.call('ZCARD', KEYS[1])
if n + #ARGV - 4 > tonumber(ARGV[1]) then return n end
for i = 5, #ARGV do redis.call('ZADD', KEYS[1], now, ARGV[i]) end
redis.call('EXPIRE', KEYS[1], ARGV[4])
return -1

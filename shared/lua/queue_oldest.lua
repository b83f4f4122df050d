-- The earliest (re)queue time of a job waiting in a model's queue. KEYS: the model's priority
-- lists, then the queued zset. ARGV: the model, as records store it (JSON); the job key prefix
-- (keys.job('')). Returns it, or false.
-- A list's oldest message is at its popping end (kombu pushes on the left, workers pop on the right)
-- unless fair share put a newer job of another tenant there (job_submit.lua): so the queued zset
-- (every model's waiting jobs, by time) is read too, oldest first, up to its first 256 entries.
local oldest = false
for i = 1, #KEYS - 1 do
  local raw = redis.call('LINDEX', KEYS[i], -1)
  if raw then
    local ok, msg = pcall(cjson.decode, raw)
    local id = ok and type(msg) == 'table' and type(msg.headers) == 'table' and msg.headers.id
    local at = type(id) == 'string' and redis.call('ZSCORE', KEYS[#KEYS], id)
    if at and (not oldest or tonumber(at) < oldest) then oldest = tonumber(at) end
  end
end
local rows = redis.call('ZRANGE', KEYS[#KEYS], 0, 255, 'WITHSCORES')
for i = 1, #rows, 2 do
  local rec = redis.call('HMGET', ARGV[2] .. rows[i], 'model', 'status')
  if rec[1] == ARGV[1] and rec[2] == STATUS.queued then
    local at = tonumber(rows[i + 1])
    if not oldest or at < oldest then oldest = at end
    break
  end
end
if oldest then return tostring(oldest) end
return false

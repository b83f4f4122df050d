-- The oldest message of each list (kombu pushes on the left, workers pop on the right) -> its job's
-- (re)queue time. KEYS: a model's priority lists, then the queued zset. Returns the earliest.
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
if oldest then return tostring(oldest) end
return false

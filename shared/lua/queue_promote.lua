-- Move a tenant's next message to the popping end of its list (kombu pushes on the left and pops on
-- the right): a worker's tenant reserve takes the job of a tenant below its share of the worker that
-- waits behind another tenant's (worker/kombu_gate.py). The message stays in its list, so its fair
-- share's counts and tag order (job_submit.lua) still hold it until a worker pops it, moments later.
-- KEYS: the lists to look in, in the order a pop takes them. ARGV: the tenant's header as kombu
-- writes it ('"tenant": "NAME"', a quick test before the message is decoded), the tenant, the most
-- messages looked at from the popping end of each list. Returns the (1-based) index of the list its
-- message is now at the end of, or 0 when none of the messages looked at is the tenant's.
local walk = tonumber(ARGV[3])
for i, list in ipairs(KEYS) do
  local msgs = redis.call('LRANGE', list, -walk, -1)
  for j = #msgs, 1, -1 do
    local m = msgs[j]
    if string.find(m, ARGV[1], 1, true) then
      local ok, d = pcall(cjson.decode, m)
      if ok and type(d) == 'table' and type(d.headers) == 'table' and d.headers.tenant == ARGV[2] then
        if j < #msgs then
          redis.call('LREM', list, -1, m)
          redis.call('RPUSH', list, m)
        end
        return i
      end
    end
  end
end
return 0

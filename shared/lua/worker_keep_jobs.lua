-- Each heartbeat: the jobs a worker runs keep their record and log alive, and its job set keeps only
-- jobs running under it. An id whose record is gone (expired), ended, queued again or another
-- worker's is a phantom: it leaves the set (else it would count as running forever). A job the claim
-- script has just listed is running under the worker in its record: it stays.
-- KEYS: the worker's job set, then per job its hash and log. ARGV: worker id (JSON), ttl, then per job
-- its id and '1' when the worker runs it (its record and log live another ttl; '': only listed).
-- Returns the ids taken out of the set.
local removed = {}
for i = 1, (#KEYS - 1) / 2 do
  local h, log, id = KEYS[2 * i], KEYS[2 * i + 1], ARGV[2 * i + 1]
  if redis.call('HGET', h, 'status') == STATUS.running and redis.call('HGET', h, 'worker') == ARGV[1] then
    if ARGV[2 * i + 2] == '1' then
      redis.call('EXPIRE', h, ARGV[2])
      redis.call('EXPIRE', log, ARGV[2])
    end
  elseif redis.call('SREM', KEYS[1], id) == 1 then
    removed[#removed + 1] = id
  end
end
return removed

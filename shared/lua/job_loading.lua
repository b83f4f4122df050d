-- Log a job's `loading` event (its model is asleep on the workers that can serve it) while the job is
-- still queued and its log empty: the gateway that queued it, right after; and say on the wanted
-- channel that a job waits for the model (the workers holding it asleep look at once). KEYS: job
-- hash, log, channel, the wanted channel. ARGV: the event (JSON; its seq, 1, set here), the model.
-- Returns 1 (logged) or 0 (the job was taken, cancelled or has events already: nothing written). The
-- log lives as long as the record.
if redis.call('HGET', KEYS[1], 'status') ~= STATUS.queued then return 0 end
if last_seq(KEYS[2]) ~= 0 then return 0 end
local data = cjson.encode(event(ARGV[1], 1))
redis.call('XADD', KEYS[2], '1-0', 'e', data)
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then redis.call('PEXPIRE', KEYS[2], ttl) end
redis.call('PUBLISH', KEYS[3], data)
redis.call('PUBLISH', KEYS[4], ARGV[2])
return 1

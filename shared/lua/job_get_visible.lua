-- The whole record when the job exists and is that owner's, else nothing: the same work whether
-- the job is missing or another owner's, and a reply of the same size.
-- KEYS: job hash. ARGV: owner as stored (JSON) or '' (anyone may see it).
if ARGV[1] ~= '' and redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return {} end
return redis.call('HGETALL', KEYS[1])

-- Remove a LoRA adapter from the fleet's registry if the caller may.
-- KEYS[1]: the registry. ARGV[1]: the name; ARGV[2]: the caller's owner id ('' for an operator);
-- ARGV[3]: '1' when the caller may remove any adapter; ARGV[4]: '1' to remove only an adapter whose
-- id is ARGV[5] (a load undone: a newer registration under the name stays).
-- Returns {outcome, the JSON removed or false}; outcome: 'removed', 'missing' or 'owned'.
local old = redis.call('HGET', KEYS[1], ARGV[1])
if not old then
  return {'missing', false}
end
local o = cjson.decode(old)
local owner = o.owner
if owner == nil or owner == cjson.null then owner = '' end
if ARGV[3] ~= '1' and owner ~= ARGV[2] then
  return {'owned', old}
end
if ARGV[4] == '1' and tostring(o.id) ~= ARGV[5] then
  return {'missing', false}
end
redis.call('HDEL', KEYS[1], ARGV[1])
return {'removed', old}

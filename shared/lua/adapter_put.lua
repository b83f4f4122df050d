-- Register a LoRA adapter in the fleet's registry, atomically, under a new id (unique by
-- construction: a counter), unless the registry already holds it as asked.
-- KEYS[1]: the registry (hash: name -> AdapterInfo JSON); KEYS[2]: the id counter.
-- ARGV[1]: the name; ARGV[2]: its AdapterInfo JSON, starting {"id":0, (the id is filled in here);
-- ARGV[3]: 'settings' (a worker's own adapters: kept, id and all, if the registry has it with
-- the same parent and path), 'new' (refused if the name is taken) or 'replace';
-- ARGV[4]: the caller's owner id ('' for an operator); ARGV[5]: '1' when the caller may change
-- any adapter (an operator).
-- Returns {outcome, the JSON now registered, the JSON it replaced or false}; outcome: 'put',
-- 'kept', 'exists' (a 'new' name taken) or 'owned' (a 'replace' of another owner's adapter).
local old = redis.call('HGET', KEYS[1], ARGV[1])
if old then
  local o = cjson.decode(old)
  local owner = o.owner
  if owner == nil or owner == cjson.null then owner = '' end
  if ARGV[3] == 'settings' then
    local new = cjson.decode(ARGV[2])
    if o.path == new.path and o.parent == new.parent and tonumber(o.id or 0) > 0 then
      return {'kept', old, false}
    end
  elseif ARGV[3] == 'new' then
    return {'exists', old, false}
  elseif ARGV[5] ~= '1' and owner ~= ARGV[4] then
    return {'owned', old, false}
  end
end
local id = redis.call('INCR', KEYS[2])
local raw = string.gsub(ARGV[2], '^{"id":0,', '{"id":' .. id .. ',', 1)
redis.call('HSET', KEYS[1], ARGV[1], raw)
return {'put', raw, old or false}

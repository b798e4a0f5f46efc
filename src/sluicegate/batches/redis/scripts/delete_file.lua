-- ARGV: id, tenant, due: '' deletes the tenant's file; a time deletes the file (whoever's)
-- if it expired by then
local id, tenant, due = ARGV[1], ARGV[2], ARGV[3]
local fk = B .. 'f:' .. id
local owner = redis.call('HGET', fk, 'tenant')
if due ~= '' then
  if not owner then
    redis.call('ZREM', B .. 'fexp', id)
    return 0
  end
  local at = redis.call('HGET', fk, 'expires_at')
  if not at or tonumber(at) > tonumber(due) then return 0 end
  tenant = owner
end
if owner ~= tenant then return 0 end
local size = tonumber(redis.call('HGET', fk, 'bytes') or '0')
-- Deletes first: at maxmemory Redis refuses a script's first write that may grow memory
-- (HINCRBY), but not later ones, so a full store can still delete files to make room.
redis.call('DEL', fk)
redis.call('UNLINK', B .. 'fl:' .. id)
redis.call('ZREM', B .. 'files:' .. tenant, id)
redis.call('ZREM', B .. 'fexp', id)
redis.call('ZREM', B .. 'fexp:' .. tenant, id)
-- a file stored before quotas existed was never counted: the counter stops at 0
if redis.call('HINCRBY', B .. 'usage:' .. tenant, 'bytes', -size) < 0 then
  redis.call('HSET', B .. 'usage:' .. tenant, 'bytes', 0)
end
return 1

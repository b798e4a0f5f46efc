-- ARGV: kind, id, tenant, quota ('' none: active batches; a file's was reserved), expires_at
-- ('' none), then the fields. A file is its reservation made real (false if it was swept);
-- a batch is refused past the tenant's active batches: {'active_batches', soonest end}.
local kind, id, tenant, quota, expires = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local fields = {}
for i = 6, #ARGV do fields[#fields + 1] = ARGV[i] end
local seq
if kind == 'file' then
  if redis.call('HDEL', B .. 'uploads', id) == 0 then return false end
  redis.call('HINCRBY', B .. 'usage:' .. tenant, 'pending', -1)
  redis.call('ZREM', B .. 'upload_at', id)
  seq = redis.call('INCR', B .. 'seq')
  redis.call('HSET', B .. 'f:' .. id, 'seq', seq, unpack(fields))
  redis.call('PERSIST', B .. 'fl:' .. id)
  redis.call('ZADD', B .. 'files:' .. tenant, seq, id)
  if expires ~= '' then
    redis.call('ZADD', B .. 'fexp', expires, id)
    redis.call('ZADD', B .. 'fexp:' .. tenant, expires, id)
  end
else
  local active = B .. 'active:' .. tenant
  if quota ~= '' and redis.call('ZCARD', active) >= tonumber(quota) then
    local first = redis.call('ZRANGE', active, 0, 0, 'WITHSCORES')
    return {'active_batches', first[2] or ''}
  end
  seq = redis.call('INCR', B .. 'seq')
  redis.call('HSET', B .. 'b:' .. id, 'seq', seq, unpack(fields))
  redis.call('ZADD', B .. 'batches:' .. tenant, seq, id)
  redis.call('ZADD', B .. 'st:validating', seq, id)
  redis.call('HINCRBY', B .. 'nstatus', 'validating', 1)
  redis.call('ZADD', active, expires, id)
end
return seq

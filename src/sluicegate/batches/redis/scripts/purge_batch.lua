-- ARGV: id, due. A batch over since before due goes, with its counters.
local id, due = ARGV[1], tonumber(ARGV[2])
local bk = B .. 'b:' .. id
local status = redis.call('HGET', bk, 'status')
local at = redis.call('ZSCORE', B .. 'ended', id)
if not status then
  redis.call('ZREM', B .. 'ended', id)
  return 0
end
if ACTIVE[status] or not at or tonumber(at) > due then return 0 end
local tenant = redis.call('HGET', bk, 'tenant')
redis.call('DEL', bk)
for _, name in ipairs({'n', 'body', 'cid', 'model', 'att', 'own', 'res'}) do
  redis.call('UNLINK', B .. name .. ':' .. id)
end
redis.call('ZREM', B .. 'batches:' .. tenant, id)
redis.call('ZREM', B .. 'ended', id)
redis.call('HINCRBY', B .. 'nstatus', status, -1)
return 1

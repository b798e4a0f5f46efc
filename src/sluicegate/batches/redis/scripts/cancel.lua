-- ARGV: id, tenant, now. The tenant's validating or in_progress batch (not yet ending) becomes
-- cancelling; 0 if the batch is not the tenant's.
local id, tenant, now = ARGV[1], ARGV[2], ARGV[3]
local bk = B .. 'b:' .. id
if redis.call('HGET', bk, 'tenant') ~= tenant then return 0 end
local status = redis.call('HGET', bk, 'status')
if (status == 'validating' or status == 'in_progress')
    and redis.call('HEXISTS', bk, 'ending') == 0 then
  move(id, status, 'cancelling')
  redis.call('HSET', bk, 'cancelling_at', now)
  redis.call('ZREM', B .. 'expiry', id)
  redis.call('ZREM', B .. 'full', id)
end
return 1

-- ARGV: id, kind (cancelled, completed or expired), now. Marks a batch that is due ending
-- (completed: finalizing first); 1 if it did.
local id, kind, now = ARGV[1], ARGV[2], tonumber(ARGV[3])
local bk = B .. 'b:' .. id
local status = redis.call('HGET', bk, 'status')
if redis.call('HEXISTS', bk, 'ending') == 1 then return 0 end
if kind == 'cancelled' then
  if status ~= 'cancelling' then return 0 end
elseif status ~= 'in_progress' then
  return 0
elseif kind == 'expired' then
  if tonumber(redis.call('HGET', bk, 'expires_at')) > now then return 0 end
else
  local done = tonumber(redis.call('HGET', B .. 'n:' .. id, 'done') or '0')
  if done < tonumber(redis.call('HGET', bk, 'total')) then return 0 end
  move(id, 'in_progress', 'finalizing')
  redis.call('HSET', bk, 'finalizing_at', now)
end
redis.call('HSET', bk, 'ending', kind)
redis.call('ZREM', B .. 'expiry', id)
redis.call('ZREM', B .. 'full', id)
redis.call('ZADD', B .. 'ending', redis.call('HGET', bk, 'seq'), id)
return 1

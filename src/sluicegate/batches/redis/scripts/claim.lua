-- ARGV: model, owner, limit, now, lease end. Delayed lines now due become ready; then up to
-- limit lines are leased to owner, those whose lease ran out first, then ready ones:
-- each {batch id, index, custom_id, body, failed attempts}.
local model, owner = ARGV[1], ARGV[2]
local limit, now, until_ = tonumber(ARGV[3]), ARGV[4], ARGV[5]
local ready, delayed = B .. 'ready:' .. model, B .. 'delayed:' .. model
local leased = B .. 'leased:' .. model
for _, m in ipairs(redis.call('ZRANGEBYSCORE', delayed, '-inf', now, 'LIMIT', 0, 1000)) do
  local id = split(m)
  redis.call('ZREM', delayed, m)
  local seq = redis.call('HGET', B .. 'b:' .. id, 'seq')
  if seq then redis.call('ZADD', ready, seq, m) end
end
local out = {}
local function take(m, from)
  local id, idx = split(m)
  local bk = B .. 'b:' .. id
  if redis.call('HGET', bk, 'status') ~= 'in_progress' or redis.call('HEXISTS', bk, 'ending') == 1
      or redis.call('HEXISTS', B .. 'res:' .. id, idx) == 1 then
    redis.call('ZREM', from, m)
    return
  end
  if from == ready then
    redis.call('ZREM', ready, m)
    redis.call('HINCRBY', B .. 'n:' .. id, 'q|' .. model, -1)
    redis.call('HINCRBY', B .. 'n:' .. id, 'r|' .. model, 1)
  end
  redis.call('ZADD', leased, until_, m)
  redis.call('HSET', B .. 'own:' .. id, idx, owner)
  out[#out + 1] = {
    id, idx, redis.call('HGET', B .. 'cid:' .. id, idx),
    redis.call('HGET', B .. 'body:' .. id, idx),
    redis.call('HGET', B .. 'att:' .. id, idx) or '0'
  }
end
for _, m in ipairs(redis.call('ZRANGEBYSCORE', leased, '-inf', '(' .. now, 'LIMIT', 0, limit)) do
  take(m, leased)
end
local looked = 0
while #out < limit and looked < 10 * limit + 1000 do
  local heads = redis.call('ZRANGE', ready, 0, limit - #out - 1)
  if #heads == 0 then break end
  for _, m in ipairs(heads) do take(m, ready) end
  looked = looked + #heads
end
return out

-- ARGV: owner, lease end, then per line: model, batch id, index. Extends the lease of the
-- lines owner still holds.
local owner, until_ = ARGV[1], ARGV[2]
for i = 3, #ARGV, 3 do
  local model, id, idx = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if redis.call('HGET', B .. 'own:' .. id, idx) == owner then
    redis.call('ZADD', B .. 'leased:' .. model, 'XX', until_, member(id, idx))
  end
end
return 0

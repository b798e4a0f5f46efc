-- ARGV: id, token, now, total, errors JSON ('' when the lines run), error lines, then per model:
-- name, runnable lines
local id, token, now, total, errors, failed = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local bk, stage = B .. 'b:' .. id, B .. 'stage:' .. ARGV[2] .. ':'
if redis.call('HGET', bk, 'status') ~= 'validating'
    or redis.call('HGET', bk, 'checker') ~= token then
  return 0
end
redis.call('HDEL', bk, 'checker', 'checker_until')
if errors ~= '' then
  move(id, 'validating', 'failed')
  redis.call('HSET', bk, 'failed_at', now, 'errors', errors)
  redis.call('ZREM', B .. 'active:' .. redis.call('HGET', bk, 'tenant'), id)
  redis.call('ZADD', B .. 'ended', now, id)
  return 1
end
for _, name in ipairs({'body', 'cid', 'model', 'res'}) do
  if redis.call('EXISTS', stage .. name) == 1 then
    redis.call('RENAME', stage .. name, B .. name .. ':' .. id)
    redis.call('PERSIST', B .. name .. ':' .. id)
  end
end
local seq, nk = redis.call('HGET', bk, 'seq'), B .. 'n:' .. id
local entry = turn_entry(redis.call('HGET', bk, 'tenant'), seq, id)
for i = 7, #ARGV, 2 do
  local model, staged = ARGV[i], stage .. 'ready:' .. ARGV[i]
  local n = redis.call('ZCARD', staged)
  for start = 0, n - 1, 1000 do
    local args = {}
    for _, m in ipairs(redis.call('ZRANGE', staged, start, start + 999)) do
      args[#args + 1] = seq
      args[#args + 1] = m
    end
    redis.call('ZADD', B .. 'ready:' .. model, unpack(args))
  end
  redis.call('DEL', staged)
  redis.call('ZADD', B .. 'turns:' .. model, 0, entry)
  redis.call('HSET', nk, 'q|' .. model, ARGV[i + 1])
end
redis.call('HSET', nk, 'failed', failed, 'done', failed)
move(id, 'validating', 'in_progress')
redis.call('HSET', bk, 'in_progress_at', now, 'total', total)
redis.call('ZADD', B .. 'expiry', redis.call('HGET', bk, 'expires_at'), id)
return 1

-- ARGV: id, kind, now, then for the output and the error file: id, lines, bytes; then when
-- the files expire ('' never)
local id, kind, now, expires = ARGV[1], ARGV[2], ARGV[3], ARGV[10]
local bk, nk = B .. 'b:' .. id, B .. 'n:' .. id
if redis.call('HGET', bk, 'ending') ~= kind then return 0 end
local tenant = redis.call('HGET', bk, 'tenant')
local files = {{ARGV[4], ARGV[5], ARGV[6], 'output', 'output_file_id'},
               {ARGV[7], ARGV[8], ARGV[9], 'errors', 'error_file_id'}}
for _, f in ipairs(files) do
  if tonumber(f[2]) > 0 then
    local seq = redis.call('INCR', B .. 'seq')
    redis.call('HSET', B .. 'f:' .. f[1], 'seq', seq, 'id', f[1], 'tenant', tenant,
      'purpose', 'batch_output', 'filename', id .. '_' .. f[4] .. '.jsonl', 'bytes', f[3],
      'lines', f[2], 'created_at', now)
    redis.call('PERSIST', B .. 'fl:' .. f[1])
    redis.call('ZADD', B .. 'files:' .. tenant, seq, f[1])
    redis.call('HSET', bk, f[5], f[1])
    redis.call('HINCRBY', B .. 'usage:' .. tenant, 'bytes', f[3])
    if expires ~= '' then
      redis.call('HSET', B .. 'f:' .. f[1], 'expires_at', expires)
      redis.call('ZADD', B .. 'fexp', expires, f[1])
      redis.call('ZADD', B .. 'fexp:' .. tenant, expires, f[1])
    end
  end
end
local total = tonumber(redis.call('HGET', bk, 'total') or '0')
local completed = tonumber(redis.call('HGET', nk, 'completed') or '0')
if total > 0 then redis.call('HSET', nk, 'failed', total - completed, 'done', total) end
move(id, redis.call('HGET', bk, 'status'), kind)
redis.call('HSET', bk, kind .. '_at', now)
redis.call('HDEL', bk, 'ending')
redis.call('ZREM', B .. 'ending', id)
redis.call('ZREM', B .. 'active:' .. tenant, id)
redis.call('ZADD', B .. 'ended', now, id)
for _, name in ipairs({'body', 'cid', 'model', 'att', 'own', 'res'}) do
  redis.call('UNLINK', B .. name .. ':' .. id)
end
return 1

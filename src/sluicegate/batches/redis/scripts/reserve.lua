-- ARGV: tenant, id, bytes, now, max bytes ('' none), max files ('' none)
local tenant, id, size, now = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local usage = B .. 'usage:' .. tenant
local used = tonumber(redis.call('HGET', usage, 'bytes') or '0')
local pending = tonumber(redis.call('HGET', usage, 'pending') or '0')
local over
if ARGV[6] ~= ''
    and redis.call('ZCARD', B .. 'files:' .. tenant) + pending + 1 > tonumber(ARGV[6]) then
  over = 'files'
elseif ARGV[5] ~= '' and used + size > tonumber(ARGV[5]) then
  over = 'bytes'
end
if over then
  local first = redis.call('ZRANGE', B .. 'fexp:' .. tenant, 0, 0, 'WITHSCORES')
  return {over, first[2] or ''}
end
redis.call('HINCRBY', usage, 'bytes', size)
redis.call('HINCRBY', usage, 'pending', 1)
redis.call('HSET', B .. 'uploads', id, tenant .. '|' .. size)
redis.call('ZADD', B .. 'upload_at', now, id)
return 1

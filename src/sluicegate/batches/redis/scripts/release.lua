-- ARGV: id. An upload that will not become a file: its lines and its reservation go.
local id = ARGV[1]
if redis.call('EXISTS', B .. 'f:' .. id) == 0 then redis.call('UNLINK', B .. 'fl:' .. id) end
redis.call('ZREM', B .. 'upload_at', id)
local held = redis.call('HGET', B .. 'uploads', id)
if not held then return 0 end
local tenant, size = string.match(held, '^(.*)|(%d+)$')
redis.call('HDEL', B .. 'uploads', id)
redis.call('HINCRBY', B .. 'usage:' .. tenant, 'bytes', -tonumber(size))
redis.call('HINCRBY', B .. 'usage:' .. tenant, 'pending', -1)
return 1

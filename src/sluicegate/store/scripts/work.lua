-- ARGV: replica, ttl_ms, then field, value pairs: the replica's work summary, one field
-- per lane that holds work (store/work_summary.py). Replaces the replica's hash
-- work:<replica> (none when it holds no work), expiring ttl_ms after this call; returns,
-- for every other live replica whose hash holds fields, its id and the hash's fields
-- and values: {replica, {field, value, ...}, ...}.
local replica, ttl = ARGV[1], tonumber(ARGV[2])
local own = base .. 'work:' .. replica
redis.call('DEL', own)
if #ARGV > 2 then
  redis.call('HSET', own, unpack(ARGV, 3))
  redis.call('PEXPIRE', own, ttl)
end
local out = {}
for _, other in ipairs(live_replicas(now_ms())) do
  if other ~= replica then
    local fields = redis.call('HGETALL', base .. 'work:' .. other)
    if #fields > 0 then
      out[#out + 1] = other
      out[#out + 1] = fields
    end
  end
end
return out

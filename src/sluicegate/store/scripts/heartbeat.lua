-- ARGV: replica, lease_ttl_ms, joined 0|1. Refreshes the replica's liveness, reaps replicas
-- whose expiry is more than one TTL past, returns the number of live replicas; -1 for a
-- joined session the store does not know (it restarted empty, or reaped it as dead).
local replica, ttl = ARGV[1], tonumber(ARGV[2])
local now = now_ms()
local replicas_key = base .. 'replicas'
if ARGV[3] == '1' and not redis.call('ZSCORE', replicas_key, replica) then return -1 end
redis.call('ZADD', replicas_key, now + ttl, replica)
for _, dead in ipairs(redis.call('ZRANGEBYSCORE', replicas_key, '-inf', '(' .. fmt(now - ttl))) do
  withdraw_all(dead)
  forget_leases(dead)
  redis.call('DEL', base .. 'grants:' .. dead)
  redis.call('ZREM', replicas_key, dead)
end
return redis.call('ZCOUNT', replicas_key, now, '+inf')

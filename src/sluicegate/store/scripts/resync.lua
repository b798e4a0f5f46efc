-- ARGV: replica, lease_ttl_ms, count, then count × (ticket, lane, tenant, weight, cost).
-- Replaces the replica's leases, withdraws its waiters, clears its grants, marks it live.
local replica, ttl = ARGV[1], tonumber(ARGV[2])
withdraw_all(replica)
redis.call('DEL', base .. 'lease:' .. replica, base .. 'held:' .. replica, base .. 'grants:' .. replica)
local count = tonumber(ARGV[3])
local i = 4
for _ = 1, count do
  write_lease(replica, ARGV[i], ARGV[i + 1], ARGV[i + 2], tonumber(ARGV[i + 4]), tonumber(ARGV[i + 3]))
  i = i + 5
end
redis.call('ZADD', base .. 'replicas', now_ms() + ttl, replica)
return count

-- ARGV: replica, lease_ttl_ms, count, then count × (ticket, lane, tenant, weight, cost, priority,
-- preemptible_in_ms (-1: never), borrowed 0|1, counted 0|1).
-- Replaces the replica's leases, withdraws its waiters, clears its grants, marks it live.
-- A lease written back counts as admitted a moment ago: preemptible from now plus what the
-- replica says is left of its wait.
local replica, ttl = ARGV[1], tonumber(ARGV[2])
withdraw_all(replica)
forget_leases(replica)
-- A new session starts its syncs from 1: a predecessor under the same id (a restarted
-- worker keeps its replica id) must not fence them off as stale.
redis.call('DEL', base .. 'grants:' .. replica, base .. 'last:' .. replica)
local now = now_ms()
local count = tonumber(ARGV[3])
local i = 4
for _ = 1, count do
  local preemptible_in = tonumber(ARGV[i + 6])
  local preemptible_from = -1
  if preemptible_in >= 0 then preemptible_from = now + preemptible_in end
  write_lease(replica, ARGV[i], ARGV[i + 1], ARGV[i + 2], tonumber(ARGV[i + 4]),
              tonumber(ARGV[i + 3]), tonumber(ARGV[i + 5]), now - 1, preemptible_from,
              tonumber(ARGV[i + 7]), tonumber(ARGV[i + 8]))
  i = i + 9
end
redis.call('ZADD', base .. 'replicas', now + ttl, replica)
return count

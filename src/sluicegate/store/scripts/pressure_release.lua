-- The pressure poller's lease (store/pressure_lease.py). KEYS: the lease. ARGV: replica.
-- Deletes the lease if the caller holds it: a poller that stops hands over at once rather
-- than when its lease runs out. Returns 1 if deleted, 0 if not.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0

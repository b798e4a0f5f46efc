-- The pressure poller's lease (store/pressure_lease.py). KEYS: the lease, the published
-- stage. ARGV: replica, lease_ms. Takes the lease when it is free (SET NX PX) or extends it
-- when the caller holds it (compare-and-extend), then reads the published stage. Returns
-- {holder, stage JSON or false, its age in ms}.
local replica, lease_ms = ARGV[1], ARGV[2]
local holder = redis.call('GET', KEYS[1])
if holder == replica then
  redis.call('PEXPIRE', KEYS[1], lease_ms)
elseif not holder then
  redis.call('SET', KEYS[1], replica, 'NX', 'PX', lease_ms)
  holder = replica
end
local published = redis.call('HMGET', KEYS[2], 'stage', 'at')
if not published[1] or not published[2] then
  return {holder, false, 0}
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
return {holder, published[1], now - tonumber(published[2])}

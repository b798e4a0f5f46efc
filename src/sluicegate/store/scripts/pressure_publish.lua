-- The pressure poller's stage (store/pressure_lease.py). KEYS: the lease, the published
-- stage. ARGV: replica, stage JSON, keep_ms. Writes the stage, stamped with Redis's time,
-- only while the caller holds the lease (a deposed poller cannot overwrite its
-- successor's). Returns 1 if written, 0 if not.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('HSET', KEYS[2], 'stage', ARGV[2], 'at', now)
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 1

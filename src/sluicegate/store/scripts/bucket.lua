-- Prepended to take.lua and refund.lua: core/ratelimit.py's TokenBucket on Redis time.
-- A bucket is two fields of the tenant's hash: its level and when it was last refilled.
local function now_s()
  local time = redis.call('TIME')
  return tonumber(time[1]) + tonumber(time[2]) / 1000000
end

local function fmt(x)
  return string.format('%.17g', x)
end

-- The level and refill time at `now`: refilled at `rate` up to `burst` since `last`
-- (a missing bucket, `level == false`, is full).
local function refill(level, last, rate, burst, now)
  if level == false then return burst, now end
  level, last = tonumber(level), tonumber(last)
  local elapsed = now - last
  if elapsed > 0 then
    last = now
    level = level + elapsed * rate
    if level >= burst then level = burst end
  end
  return level, last
end

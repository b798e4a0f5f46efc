-- Prepended to every model script. KEYS[1] is the model's key base "{<prefix>:<model>}:".
-- A wait entry is cmsgpack(lane, tenant, cost, weight, vtc_charge, member, fair);
-- a lease is cmsgpack(lane, tenant, cost, weight).
local base = KEYS[1]

local function now_ms()
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

local function fmt(x)
  return string.format('%.17g', x)
end

-- Fair lanes get one set per tenant; the lane's byte length keeps "a:b"+"c" apart from "a"+"b:c".
local function queue_key(lane, tenant, fair)
  if fair == 1 then
    return base .. 'fq:' .. #lane .. ':' .. lane .. ':' .. tenant
  end
  return base .. 'q:' .. lane
end

-- Take a waiter out of its sorted set, its replica's wait hash and the counts.
-- Returns its lane, its tenant and the tenant's backlog left in a fair lane (else 0).
local function withdraw(replica, ticket, packed)
  local lane, tenant, _, _, _, member, fair = cmsgpack.unpack(packed)
  redis.call('ZREM', queue_key(lane, tenant, fair), member)
  redis.call('HDEL', base .. 'wait:' .. replica, ticket)
  local left = 0
  if fair == 1 then
    local backlog_key = base .. 'bk:' .. lane
    left = redis.call('HINCRBY', backlog_key, tenant, -1)
    if left <= 0 then
      redis.call('HDEL', backlog_key, tenant)
      left = 0
    end
  end
  return lane, tenant, left
end

local function withdraw_all(replica)
  local waiting = redis.call('HGETALL', base .. 'wait:' .. replica)
  for j = 1, #waiting, 2 do
    withdraw(replica, waiting[j], waiting[j + 1])
  end
  redis.call('DEL', base .. 'wait:' .. replica)
end

local function live_replicas(now)
  return redis.call('ZRANGEBYSCORE', base .. 'replicas', now, '+inf')
end

-- Running tickets, their tokens and running tickets per lane, summed over `live`.
local function held_totals(live)
  local running, tokens, lanes = 0, 0, {}
  for _, replica in ipairs(live) do
    local held = redis.call('HGETALL', base .. 'held:' .. replica)
    for j = 1, #held, 2 do
      local field, value = held[j], tonumber(held[j + 1])
      if field == 't' then
        tokens = tokens + value
      else
        local lane = string.sub(field, 3)
        running = running + value
        lanes[lane] = (lanes[lane] or 0) + value
      end
    end
  end
  return running, tokens, lanes
end

-- Waiting tickets of a lane: its sorted set's size, or a fair lane's summed backlog.
local function lane_waiting(lane, fair)
  if fair then
    local total = 0
    for _, count in ipairs(redis.call('HVALS', base .. 'bk:' .. lane)) do
      total = total + tonumber(count)
    end
    return total
  end
  return redis.call('ZCARD', queue_key(lane, '', 0))
end

local function write_lease(replica, ticket, lane, tenant, cost, weight)
  redis.call('HSET', base .. 'lease:' .. replica, ticket, cmsgpack.pack(lane, tenant, cost, weight))
  local held_key = base .. 'held:' .. replica
  redis.call('HINCRBY', held_key, 't', cost)
  redis.call('HINCRBY', held_key, 'l:' .. lane, 1)
end

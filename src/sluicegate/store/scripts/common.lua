-- Prepended to every model script. KEYS[1] is the model's key base "{<prefix>:<model>}:".
-- A wait entry is cmsgpack(lane, tenant, cost, weight, vtc_charge, member, fair, priority,
-- urgent_ms, delay_ms, share_from_ms); a lease is cmsgpack(lane, tenant, cost, weight, priority, admitted_ms,
-- preemptible_from_ms, borrowed, counted). urgent_ms -1: never urgent; delay_ms and
-- preemptible_from_ms -1: never preemptible. Times are milliseconds on the wall clock.
-- counted 1: the lease is in its lane's running counts per tenant (`tr:<lane>`, a lane
-- that gives tenants their shares back).
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
  redis.call('ZREM', base .. 'urg', member)
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

-- Running tickets, their tokens, running and borrowed tickets per lane and borrowed tickets,
-- summed over `live`.
local function held_totals(live)
  local running, tokens, lanes, lent, borrowed = 0, 0, {}, {}, 0
  for _, replica in ipairs(live) do
    local held = redis.call('HGETALL', base .. 'held:' .. replica)
    for j = 1, #held, 2 do
      local field, value = held[j], tonumber(held[j + 1])
      local kind = string.sub(field, 1, 2)
      if field == 't' then
        tokens = tokens + value
      elseif kind == 'l:' then
        local lane = string.sub(field, 3)
        running = running + value
        lanes[lane] = (lanes[lane] or 0) + value
      elseif kind == 'b:' then
        local lane = string.sub(field, 3)
        borrowed = borrowed + value
        lent[lane] = (lent[lane] or 0) + value
      end
    end
  end
  return running, tokens, lanes, lent, borrowed
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

-- A lease's key in the victim index and the stop marks: '<replica>|<ticket>'.
local function lease_key(replica, ticket)
  return replica .. '|' .. ticket
end

local function split_key(key)
  local bar = string.find(key, '|', 1, true)
  return string.sub(key, 1, bar - 1), string.sub(key, bar + 1)
end

-- Preemptible leases are indexed in `pv` by priority, then admission time, so the cheapest
-- victim (least important, then newest: least work lost) is the highest score.
local VICTIM_SCALE = 1e13

local function write_lease(replica, ticket, lane, tenant, cost, weight, priority, admitted,
                           preemptible_from, borrowed, counted)
  redis.call('HSET', base .. 'lease:' .. replica, ticket,
             cmsgpack.pack(lane, tenant, cost, weight, priority, admitted, preemptible_from,
                           borrowed, counted))
  local held_key = base .. 'held:' .. replica
  redis.call('HINCRBY', held_key, 't', cost)
  redis.call('HINCRBY', held_key, 'l:' .. lane, 1)
  if borrowed == 1 then redis.call('HINCRBY', held_key, 'b:' .. lane, 1) end
  -- In a lane that gives tenants their shares back (`counted`): its running tickets per
  -- tenant (every replica's) and those tenants' weights.
  if counted == 1 and redis.call('HINCRBY', base .. 'tr:' .. lane, tenant, 1) == 1 then
    redis.call('HSET', base .. 'tw:' .. lane, tenant, fmt(weight))
  end
  if preemptible_from >= 0 then
    redis.call('ZADD', base .. 'pv', priority * VICTIM_SCALE + admitted, lease_key(replica, ticket))
  end
end

local function tenant_left(lane, tenant)
  if redis.call('HINCRBY', base .. 'tr:' .. lane, tenant, -1) <= 0 then
    redis.call('HDEL', base .. 'tr:' .. lane, tenant)
    redis.call('HDEL', base .. 'tw:' .. lane, tenant)
  end
end

-- Release a lease: its held counts, its victim index entry and its stop mark. Returns the
-- lease's fields and the stop mark (msgpack of lane, waiter member, borrowed) or nil.
local function release_lease(replica, ticket, lease)
  local lane, tenant, cost, weight, _, _, _, borrowed, counted = cmsgpack.unpack(lease)
  redis.call('HDEL', base .. 'lease:' .. replica, ticket)
  local held_key = base .. 'held:' .. replica
  redis.call('HINCRBY', held_key, 't', -cost)
  if redis.call('HINCRBY', held_key, 'l:' .. lane, -1) <= 0 then
    redis.call('HDEL', held_key, 'l:' .. lane)
  end
  if borrowed == 1 and redis.call('HINCRBY', held_key, 'b:' .. lane, -1) <= 0 then
    redis.call('HDEL', held_key, 'b:' .. lane)
  end
  if counted == 1 then tenant_left(lane, tenant) end
  local key = lease_key(replica, ticket)
  redis.call('ZREM', base .. 'pv', key)
  local mark = redis.call('HGET', base .. 'stop', key)
  if mark then redis.call('HDEL', base .. 'stop', key) end
  return lane, tenant, weight, mark
end

-- Forget all of a replica's leases (resync, reaping): counts, victim index, stop marks.
local function forget_leases(replica)
  local leases = redis.call('HGETALL', base .. 'lease:' .. replica)
  for j = 1, #leases, 2 do
    local key = lease_key(replica, leases[j])
    local lane, tenant, _, _, _, _, _, _, counted = cmsgpack.unpack(leases[j + 1])
    if counted == 1 then tenant_left(lane, tenant) end
    redis.call('ZREM', base .. 'pv', key)
    redis.call('HDEL', base .. 'stop', key)
  end
  redis.call('DEL', base .. 'lease:' .. replica, base .. 'held:' .. replica)
end

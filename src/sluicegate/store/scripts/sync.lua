-- ARGV: replica, lease_ttl_ms, model cap, token budget (-1: none), lane count,
-- lane count × (name, cap, borrow 0|1, fair 0|1), op count, then the ops in order:
--   O ticket lane tenant weight cost vtc_charge order_hex   (offer)
--   D ticket vtc_correction                                  (drop)
-- Applies the ops, fills free global capacity with the best waiters, and returns
-- {this replica's granted tickets, running, tokens, waiting, live replicas}.
local replica, ttl = ARGV[1], tonumber(ARGV[2])
local cap, budget = tonumber(ARGV[3]), tonumber(ARGV[4])
local lanes, fair_lanes = {}, {}
local i = 6
for _ = 1, tonumber(ARGV[5]) do
  local lane = {name = ARGV[i], cap = tonumber(ARGV[i + 1]), borrow = ARGV[i + 2] == '1',
                fair = ARGV[i + 3] == '1'}
  lanes[#lanes + 1] = lane
  fair_lanes[lane.name] = lane.fair
  i = i + 4
end

local now = now_ms()
redis.call('ZADD', base .. 'replicas', now + ttl, replica)

-- The counters of `tenants` (a list) in `lane`, in one HMGET per 1000 (Lua's stack limit).
local function counters_of(lane, tenants)
  local values = {}
  for first = 1, #tenants, 1000 do
    local last = math.min(first + 999, #tenants)
    local read = redis.call('HMGET', base .. 'vtc:' .. lane, unpack(tenants, first, last))
    for j = first, last do
      values[tenants[j]] = tonumber(read[j - first + 1] or '0')
    end
  end
  return values
end

-- A fair lane's backlogged tenants (tenant -> waiting count) and the counters read so
-- far, loaded once per script: every change below writes through to Redis and here.
local fair_states = {}
local function fair_state(lane)
  local state = fair_states[lane]
  if state == nil then
    local entries = redis.call('HGETALL', base .. 'bk:' .. lane)
    local backlog, tenants = {}, {}
    for j = 1, #entries, 2 do
      backlog[entries[j]] = tonumber(entries[j + 1])
      tenants[#tenants + 1] = entries[j]
    end
    state = {backlog = backlog, counters = counters_of(lane, tenants)}
    fair_states[lane] = state
  end
  return state
end

local function counter(state, lane, tenant)
  local value = state.counters[tenant]
  if value == nil then
    value = tonumber(redis.call('HGET', base .. 'vtc:' .. lane, tenant) or '0')
    state.counters[tenant] = value
  end
  return value
end

local function set_counter(state, lane, tenant, value)
  state.counters[tenant] = value
  redis.call('HSET', base .. 'vtc:' .. lane, tenant, fmt(value))
end

-- Take a waiter out (common.lua's withdraw) and keep a fair lane's backlog in step.
local function leave(owner, ticket, packed)
  local lane, tenant, left = withdraw(owner, ticket, packed)
  local state = fair_states[lane]
  if state ~= nil and fair_lanes[lane] then
    if left > 0 then state.backlog[tenant] = left else state.backlog[tenant] = nil end
  end
end

-- A tenant that becomes backlogged starts no lower than the least-served backlogged
-- tenant (or the frontier), so idle time earns no credit (core/fair_queue.py).
local function lift(state, lane, tenant)
  local floor = nil
  for other, _ in pairs(state.backlog) do
    local value = state.counters[other]
    if floor == nil or value < floor then floor = value end
  end
  if floor == nil then
    floor = tonumber(redis.call('GET', base .. 'front:' .. lane) or '0')
  end
  if floor > counter(state, lane, tenant) then set_counter(state, lane, tenant, floor) end
end

local function offer(ticket, lane, tenant, weight, cost, charge, order)
  local wait_key = base .. 'wait:' .. replica
  if redis.call('HEXISTS', wait_key, ticket) == 1
      or redis.call('HEXISTS', base .. 'lease:' .. replica, ticket) == 1 then
    return
  end
  local fair = 0
  if fair_lanes[lane] then
    fair = 1
    local state = fair_state(lane)
    local waiting = state.backlog[tenant] or 0
    if waiting == 0 then lift(state, lane, tenant) end
    state.backlog[tenant] = waiting + 1
    redis.call('HINCRBY', base .. 'bk:' .. lane, tenant, 1)
  end
  local member = order .. '|' .. replica .. '|' .. ticket
  redis.call('ZADD', queue_key(lane, tenant, fair), 0, member)
  redis.call('HSET', wait_key, ticket, cmsgpack.pack(lane, tenant, cost, weight, charge, member, fair))
end

local function drop(ticket, correction)
  local lease_key = base .. 'lease:' .. replica
  local lease = redis.call('HGET', lease_key, ticket)
  if lease then
    local lane, tenant, cost, weight = cmsgpack.unpack(lease)
    redis.call('HDEL', lease_key, ticket)
    local held_key = base .. 'held:' .. replica
    redis.call('HINCRBY', held_key, 't', -cost)
    if redis.call('HINCRBY', held_key, 'l:' .. lane, -1) <= 0 then
      redis.call('HDEL', held_key, 'l:' .. lane)
    end
    if fair_lanes[lane] and correction ~= 0 then
      local state = fair_state(lane)
      set_counter(state, lane, tenant, counter(state, lane, tenant) + correction / weight)
    end
    return
  end
  local packed = redis.call('HGET', base .. 'wait:' .. replica, ticket)
  if packed then leave(replica, ticket, packed) end
end

local nops = tonumber(ARGV[i])
i = i + 1
for _ = 1, nops do
  if ARGV[i] == 'O' then
    offer(ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], tonumber(ARGV[i + 4]), tonumber(ARGV[i + 5]),
          tonumber(ARGV[i + 6]), ARGV[i + 7])
    i = i + 8
  else
    drop(ARGV[i + 1], tonumber(ARGV[i + 2]))
    i = i + 3
  end
end

-- Fill: grant free global capacity, lane by lane, to the best live waiters.
local live_list = live_replicas(now)
local live = {}
for _, r in ipairs(live_list) do live[r] = true end
local running, tokens, lane_running = held_totals(live_list)
local granted = {}

local function least_served(backlog, counters)
  local best, best_counter = nil, nil
  for tenant, _ in pairs(backlog) do
    local value = counters[tenant]
    if best == nil or value < best_counter or (value == best_counter and tenant < best) then
      best, best_counter = tenant, value
    end
  end
  return best
end

-- Waiters of dead replicas met on the way are dropped, at most DEAD_PER_FILL per fill (a
-- replica that died with thousands waiting must not make one sync outlast its timeout;
-- the heartbeat's reaping and later fills take the rest).
local DEAD_PER_FILL = 128
local dead_dropped = 0
for _, lane in ipairs(lanes) do
  if dead_dropped >= DEAD_PER_FILL then break end
  local limit = cap
  if not lane.borrow and lane.cap < cap then limit = lane.cap end
  local lane_run = lane_running[lane.name] or 0
  local state = nil
  if lane.fair then state = fair_state(lane.name) end
  while running < cap and lane_run < limit and dead_dropped < DEAD_PER_FILL do
    local queue, member = nil, nil
    if state then
      local tenant = least_served(state.backlog, state.counters)
      if tenant == nil then break end
      queue = queue_key(lane.name, tenant, 1)
      member = redis.call('ZRANGE', queue, 0, 0)[1]
      if member == nil then
        redis.call('HDEL', base .. 'bk:' .. lane.name, tenant)
        state.backlog[tenant] = nil
      end
    else
      queue = queue_key(lane.name, '', 0)
      member = redis.call('ZRANGE', queue, 0, 0)[1]
      if member == nil then break end
    end
    if member then
      local first = string.find(member, '|', 1, true)
      local second = string.find(member, '|', first + 1, true)
      local owner, ticket = string.sub(member, first + 1, second - 1), string.sub(member, second + 1)
      local packed = redis.call('HGET', base .. 'wait:' .. owner, ticket)
      if not packed then
        redis.call('ZREM', queue, member)
        dead_dropped = dead_dropped + 1
      else
        local _, tenant, cost, weight, charge = cmsgpack.unpack(packed)
        if live[owner] and budget >= 0 and running > 0 and tokens + cost > budget then break end
        leave(owner, ticket, packed)
        if not live[owner] then dead_dropped = dead_dropped + 1 end
        if live[owner] then
          if state then
            local before = counter(state, lane.name, tenant)
            redis.call('SET', base .. 'front:' .. lane.name, fmt(before))
            set_counter(state, lane.name, tenant, before + charge / weight)
          end
          write_lease(owner, ticket, lane.name, tenant, cost, weight)
          running, tokens, lane_run = running + 1, tokens + cost, lane_run + 1
          if owner == replica then
            granted[#granted + 1] = ticket
          else
            local grants_key = base .. 'grants:' .. owner
            redis.call('RPUSH', grants_key, ticket)
            redis.call('PEXPIRE', grants_key, 3 * ttl)
          end
        end
      end
    end
  end
end

local waiting = 0
for _, lane in ipairs(lanes) do
  local state = fair_states[lane.name]
  if state then
    for _, count in pairs(state.backlog) do waiting = waiting + count end
  else
    waiting = waiting + lane_waiting(lane.name, lane.fair)
  end
end

return {granted, running, tokens, waiting, #live_list}

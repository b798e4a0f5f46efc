-- ARGV: replica, lease_ttl_ms, model cap, token budget (-1: none), caller's clock (ms), the
-- sync's sequence number in the replica's session, joined 0|1 (the session wrote itself in
-- with a resync), lane count, lane count × (name, cap, borrow 0|1, fair 0|1, lend 0|1,
-- shares: always|priority|-), op count, then the ops:
--   O ticket lane tenant weight cost vtc_charge order_hex priority urgent_ms delay_ms
--     share_from_ms                                                                 (offer)
--   D ticket vtc_correction                                                         (drop)
-- Applies the ops, fills free global capacity with the best waiters (own quotas in lane
-- order, then borrowing lanes from the idle quota of lending lanes), preempts for waiters
-- that are urgent or reclaim lent quota (preempt.lua), and returns {this replica's granted
-- tickets, running, tokens, waiting, live replicas, this replica's tickets to stop}.
--
-- Fencing: a replica numbers its syncs and retries a timed-out one under the same number.
-- The answer is kept (`last:<replica>`), so a sync that ran but whose answer was lost is
-- answered again, not applied twice; one older than the last applied (an attempt that
-- reached Redis after its retry and a later sync) is applied never: {'stale'}.
local replica, ttl = ARGV[1], tonumber(ARGV[2])
local cap, budget = tonumber(ARGV[3]), tonumber(ARGV[4])
local caller_now, seq = tonumber(ARGV[5]), tonumber(ARGV[6])
local last_key = base .. 'last:' .. replica
local last = redis.call('GET', last_key)
if last then
  local last_seq, answer = cmsgpack.unpack(last)
  if seq == last_seq then return answer end
  if seq < last_seq then return {'stale'} end
end
-- A joined session the store does not know (it restarted empty, or reaped the replica as
-- dead) has lost its leases and waiters here: {'lost'}, and the replica resyncs.
if ARGV[7] == '1' and not redis.call('ZSCORE', base .. 'replicas', replica) then
  return {'lost'}
end
local lanes, fair_lanes, by_name = {}, {}, {}
local i = 9
for _ = 1, tonumber(ARGV[8]) do
  local lane = {name = ARGV[i], cap = tonumber(ARGV[i + 1]), borrow = ARGV[i + 2] == '1',
                fair = ARGV[i + 3] == '1', lend = ARGV[i + 4] == '1', shares = ARGV[i + 5]}
  lanes[#lanes + 1] = lane
  by_name[lane.name] = lane
  fair_lanes[lane.name] = lane.fair
  i = i + 6
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

local regranted = {}

local function offer(ticket, lane, tenant, weight, cost, charge, order, priority, urgent, delay,
                     share_from)
  local wait_key = base .. 'wait:' .. replica
  if redis.call('HEXISTS', wait_key, ticket) == 1 then return end
  if redis.call('HEXISTS', base .. 'lease:' .. replica, ticket) == 1 then
    -- Offered again while it holds a lease: its grant was lost on the way (a grant list
    -- popped by a listener that then failed). Grant it again.
    regranted[#regranted + 1] = ticket
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
  redis.call('HSET', wait_key, ticket,
             cmsgpack.pack(lane, tenant, cost, weight, charge, member, fair, priority, urgent, delay,
                           share_from))
  if urgent >= 0 then redis.call('ZADD', base .. 'urg', urgent, member) end
end

local now = now_ms()
redis.call('ZADD', base .. 'replicas', now + ttl, replica)
local live_list = live_replicas(now)
local live = {}
for _, r in ipairs(live_list) do live[r] = true end
local granted, stops = regranted, {}

-- The owner and ticket of a waiting-set member '<order>|<replica>|<ticket>'.
local function parse_member(member)
  local first = string.find(member, '|', 1, true)
  local second = string.find(member, '|', first + 1, true)
  return string.sub(member, first + 1, second - 1), string.sub(member, second + 1)
end

-- Tell `owner` of `ticket`: in this sync's `answer` list if the owner is the caller, else on
-- its grant list as `item` (the ticket for a grant, '!' .. ticket for a stop).
local function tell(owner, ticket, answer, item)
  if owner == replica then
    answer[#answer + 1] = ticket
  else
    local grants_key = base .. 'grants:' .. owner
    redis.call('RPUSH', grants_key, item)
    redis.call('PEXPIRE', grants_key, 3 * ttl)
  end
end

-- Grant a waiter (its wait entry `packed`) a slot: its tenant's counter in a fair lane, the
-- lease, and the news to its replica.
local function grant(owner, ticket, packed, lent)
  local lane, tenant, cost, weight, charge, _, fair, priority, _, delay = cmsgpack.unpack(packed)
  leave(owner, ticket, packed)
  if fair == 1 then
    local state = fair_state(lane)
    local before = counter(state, lane, tenant)
    redis.call('SET', base .. 'front:' .. lane, fmt(before))
    set_counter(state, lane, tenant, before + charge / weight)
  end
  local preemptible_from = -1
  if delay >= 0 then preemptible_from = now + delay end
  local spec, counted = by_name[lane], 0
  if spec and spec.fair and spec.shares ~= '-' then counted = 1 end
  write_lease(owner, ticket, lane, tenant, cost, weight, priority, now, preemptible_from, lent,
              counted)
  tell(owner, ticket, granted, ticket)
end

local function drop(ticket, correction)
  local lease = redis.call('HGET', base .. 'lease:' .. replica, ticket)
  if lease then
    local lane, tenant, weight, mark = release_lease(replica, ticket, lease)
    if fair_lanes[lane] and correction ~= 0 then
      local state = fair_state(lane)
      set_counter(state, lane, tenant, counter(state, lane, tenant) + correction / weight)
    end
    if mark then
      -- A victim stopped for a waiter: the slot it frees is that waiter's, if it still waits.
      local waiter_lane, member, lent = cmsgpack.unpack(mark)
      if redis.call('HGET', base .. 'pend', waiter_lane) == lease_key(replica, ticket) then
        redis.call('HDEL', base .. 'pend', waiter_lane)
      end
      local owner, waiter = parse_member(member)
      local packed = redis.call('HGET', base .. 'wait:' .. owner, waiter)
      if packed and live[owner] then grant(owner, waiter, packed, lent) end
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
          tonumber(ARGV[i + 6]), ARGV[i + 7], tonumber(ARGV[i + 8]), tonumber(ARGV[i + 9]),
          tonumber(ARGV[i + 10]), tonumber(ARGV[i + 11]))
    i = i + 12
  else
    drop(ARGV[i + 1], tonumber(ARGV[i + 2]))
    i = i + 3
  end
end

-- Fill: grant free global capacity to the best live waiters, own quotas in lane order, then
-- borrowing lanes from the idle quota of lending lanes (core/admission.py's two passes).
local running, tokens, lane_running, lane_borrowed, borrowed = held_totals(live_list)

local function own(lane)
  return (lane_running[lane.name] or 0) - (lane_borrowed[lane.name] or 0)
end

-- Idle own quota of lending lanes, less what is already borrowed (ModelRuntime.lendable).
local function lendable()
  local idle = -borrowed
  for _, lane in ipairs(lanes) do
    if lane.lend then
      local used = own(lane)
      if used < lane.cap then idle = idle + lane.cap - used end
    end
  end
  return idle
end

local function count_grant(lane_name, cost, lent)
  running, tokens = running + 1, tokens + cost
  lane_running[lane_name] = (lane_running[lane_name] or 0) + 1
  if lent == 1 then
    borrowed = borrowed + 1
    lane_borrowed[lane_name] = (lane_borrowed[lane_name] or 0) + 1
  end
end

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

-- A lane's best waiter: its sorted set and member, or nil when none waits.
local function head_of(lane)
  if lane.fair then
    local state = fair_state(lane.name)
    while true do
      local tenant = least_served(state.backlog, state.counters)
      if tenant == nil then return nil end
      local queue = queue_key(lane.name, tenant, 1)
      local member = redis.call('ZRANGE', queue, 0, 0)[1]
      if member then return queue, member end
      redis.call('HDEL', base .. 'bk:' .. lane.name, tenant)
      state.backlog[tenant] = nil
    end
  end
  local queue = queue_key(lane.name, '', 0)
  local member = redis.call('ZRANGE', queue, 0, 0)[1]
  if member == nil then return nil end
  return queue, member
end

-- Waiters of dead replicas met on the way are dropped, at most DEAD_PER_FILL per fill (a
-- replica that died with thousands waiting must not make one sync outlast its timeout;
-- the heartbeat's reaping and later fills take the rest).
local DEAD_PER_FILL = 128
local dead_dropped = 0

-- Admit from `lane` while it has room (own quota, or lent quota when `lending`).
local function fill_lane(lane, lending)
  while running < cap and dead_dropped < DEAD_PER_FILL do
    if lending then
      if lendable() <= 0 then return end
    elseif own(lane) >= lane.cap then
      return
    end
    local queue, member = head_of(lane)
    if queue == nil then return end
    local owner, ticket = parse_member(member)
    local packed = redis.call('HGET', base .. 'wait:' .. owner, ticket)
    if not packed then
      redis.call('ZREM', queue, member)
      dead_dropped = dead_dropped + 1
    elseif not live[owner] then
      leave(owner, ticket, packed)
      dead_dropped = dead_dropped + 1
    else
      local cost = select(3, cmsgpack.unpack(packed))
      if budget >= 0 and running > 0 and tokens + cost > budget then return end
      local lent = 0
      if lending then lent = 1 end
      grant(owner, ticket, packed, lent)
      count_grant(lane.name, cost, lent)
    end
  end
end

for _, lane in ipairs(lanes) do fill_lane(lane, false) end
for _, lane in ipairs(lanes) do
  if lane.borrow then fill_lane(lane, true) end
end

-- Preemption (core/preemption.py across replicas). A lane has at most one victim stopping
-- for it (`pend`: lane -> victim's lease key; `stop`: victim's lease key -> msgpack(lane,
-- waiter member, borrowed)); the victim's drop grants its slot to that waiter.
local PREEMPT_SCAN = 64
local URGENT_PER_SYNC = 16
local preempt_now = math.max(now, caller_now)

local function pending(lane_name)
  local key = redis.call('HGET', base .. 'pend', lane_name)
  if not key then return false end
  local owner, ticket = split_key(key)
  if live[owner] and redis.call('HEXISTS', base .. 'stop', key) == 1
      and redis.call('HEXISTS', base .. 'lease:' .. owner, ticket) == 1 then
    return true
  end
  redis.call('HDEL', base .. 'pend', lane_name)
  redis.call('HDEL', base .. 'stop', key)
  return false
end

-- The cheapest running ticket whose stop frees what a waiter of `lane` (priority, cost)
-- waits for: a borrowed ticket of another lane when reclaiming, else a less important one
-- (of its own lane, own quota, when the lane is full). Preemptible by its lane's rules, not
-- admitted this very instant, and its release must make the waiter fit the token budget.
local function find_victim(lane, priority, cost, reclaim, lane_full)
  local keys = redis.call('ZREVRANGE', base .. 'pv', 0, PREEMPT_SCAN - 1)
  for _, key in ipairs(keys) do
    local owner, ticket = split_key(key)
    if live[owner] and redis.call('HEXISTS', base .. 'stop', key) == 0 then
      local lease = redis.call('HGET', base .. 'lease:' .. owner, ticket)
      if lease then
        local v_lane, _, v_cost, _, v_priority, admitted, from, lent = cmsgpack.unpack(lease)
        if not reclaim and v_priority <= priority then return nil end
        local ok = from >= 0 and from <= preempt_now and admitted < now
        if reclaim then
          ok = ok and lent == 1 and v_lane ~= lane.name
        elseif lane_full then
          ok = ok and v_lane == lane.name and lent == 0
        end
        if ok and budget >= 0 and running > 0 and tokens + cost > budget then
          ok = tokens - v_cost + cost <= budget
        end
        if ok then return key, owner, ticket end
      end
    end
  end
  return nil
end

-- Mark the lease `key` stopping for the waiter `member` of `lane` (who takes its slot, own or
-- borrowed by `lent`), the lane's one pending victim, and tell the victim's replica.
local function mark_victim(lane, member, key, owner, ticket, lent)
  redis.call('HSET', base .. 'stop', key, cmsgpack.pack(lane.name, member, lent))
  redis.call('HSET', base .. 'pend', lane.name, key)
  tell(owner, ticket, stops, '!' .. ticket)
end

local function preempt_for(lane, member, packed, reclaim, lane_full)
  local _, _, cost, _, _, _, _, priority = cmsgpack.unpack(packed)
  local key, owner, ticket = find_victim(lane, priority, cost, reclaim, lane_full)
  if key == nil then return end
  -- The slot the waiter will take: the victim's own slot in a full lane; else borrowed when
  -- its lane's own quota is used up.
  local lent = 0
  if not lane_full and own(lane) >= lane.cap then lent = 1 end
  mark_victim(lane, member, key, owner, ticket, lent)
end

-- The head of `lane` and its wait entry, when it waits on a live replica.
local function live_head(lane)
  local queue, member = head_of(lane)
  if queue == nil then return nil end
  local owner, ticket = parse_member(member)
  local packed = redis.call('HGET', base .. 'wait:' .. owner, ticket)
  if packed and live[owner] then return member, packed end
  return nil
end

if running >= cap and borrowed > 0 then
  -- Reclaim: a lane whose own quota is lent out while the model is full takes it back.
  for _, lane in ipairs(lanes) do
    if own(lane) < lane.cap and not pending(lane.name) then
      local member, packed = live_head(lane)
      if member then preempt_for(lane, member, packed, true, false) end
    end
  end
end

-- Tenant shares (core/preemption.py _share_preempt): a `vtc` lane whose blocked head's tenant
-- is under its share of the lane's slots takes one back from the newest preemptible ticket
-- of the tenant furthest over its share (TenantSlots' arithmetic, on the counts of every
-- replica's running tickets).
local function share_give_back(lane)
  local member, packed = live_head(lane)
  if member == nil then return end
  local _, tenant, cost, weight, _, _, _, priority, _, _, share_from = cmsgpack.unpack(packed)
  if share_from == nil or share_from < 0 or share_from > preempt_now then return end
  local fits = budget < 0 or running == 0 or tokens + cost <= budget
  local room = running < cap and (own(lane) < lane.cap or (lane.borrow and lendable() > 0))
  if fits and room then return end
  local slots = math.min(lane.cap, cap)
  local counts, weights, running_weight = {}, {}, 0
  local raw = redis.call('HGETALL', base .. 'tr:' .. lane.name)
  local raw_weights = redis.call('HGETALL', base .. 'tw:' .. lane.name)
  for j = 1, #raw_weights, 2 do weights[raw_weights[j]] = tonumber(raw_weights[j + 1]) end
  for j = 1, #raw, 2 do
    local count = tonumber(raw[j + 1])
    if count > 0 then
      counts[raw[j]] = count
      running_weight = running_weight + (weights[raw[j]] or 1)
    end
  end
  local mine = counts[tenant] or 0
  local total = running_weight
  if mine == 0 then total = total + weight end
  if (mine + 1) * total > slots * weight then return end
  local over, any = {}, false
  for other, count in pairs(counts) do
    if other ~= tenant then
      local share = slots * (weights[other] or 1) / total
      if count - 1 >= share then
        over[other] = count / share
        any = true
      end
    end
  end
  if not any then return end
  local lowest = priority
  if lane.shares == 'priority' and lowest < 4 then lowest = 4 end
  local best, best_owner, best_ticket, best_over, best_admitted, best_lent = nil
  for _, key in ipairs(redis.call('ZREVRANGE', base .. 'pv', 0, PREEMPT_SCAN - 1)) do
    local owner, ticket = split_key(key)
    if live[owner] and redis.call('HEXISTS', base .. 'stop', key) == 0 then
      local lease = redis.call('HGET', base .. 'lease:' .. owner, ticket)
      if lease then
        local v_lane, v_tenant, v_cost, _, v_priority, admitted, from, lent = cmsgpack.unpack(lease)
        local ratio = over[v_tenant]
        if v_lane == lane.name and ratio and v_priority >= lowest and from >= 0
            and from <= preempt_now and admitted < now
            and (fits or tokens - v_cost + cost <= budget)
            and (best == nil or ratio > best_over
                 or (ratio == best_over and (admitted > best_admitted
                     or (admitted == best_admitted and key > best)))) then
          best, best_owner, best_ticket = key, owner, ticket
          best_over, best_admitted, best_lent = ratio, admitted, lent
        end
      end
    end
  end
  if best == nil then return end
  mark_victim(lane, member, best, best_owner, best_ticket, best_lent)
end

for _, lane in ipairs(lanes) do
  if lane.shares ~= '-' and lane.fair and not pending(lane.name) then share_give_back(lane) end
end

local urgent = redis.call('ZRANGEBYSCORE', base .. 'urg', '-inf', preempt_now,
                          'LIMIT', 0, URGENT_PER_SYNC)
for _, member in ipairs(urgent) do
  local owner, ticket = parse_member(member)
  local packed = redis.call('HGET', base .. 'wait:' .. owner, ticket)
  if packed and live[owner] then
    local lane = by_name[cmsgpack.unpack(packed)]
    local cost = select(3, cmsgpack.unpack(packed))
    if lane and not pending(lane.name) then
      local lane_full = own(lane) >= lane.cap and not (lane.borrow and lendable() > 0)
      local tokens_full = budget >= 0 and running > 0 and tokens + cost > budget
      if running >= cap or lane_full or tokens_full then
        preempt_for(lane, member, packed, false, lane_full)
      end
    end
  elseif not packed then
    redis.call('ZREM', base .. 'urg', member)
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

local answer = {granted, running, tokens, waiting, #live_list, stops}
redis.call('SET', last_key, cmsgpack.pack(seq, answer), 'PX', 3 * ttl)
return answer

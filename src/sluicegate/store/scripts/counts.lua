-- ARGV: lane count, then lane count × (name, fair 0|1).
-- Returns {running, tokens, waiting, live replicas, {lane, running}*, {lane, waiting}*,
-- {tenant, lane, running}*}: the last from the live replicas' leases (read-only).
local live = live_replicas(now_ms())
local running, tokens, lanes = held_totals(live)
local per_lane = {}
for lane, count in pairs(lanes) do
  per_lane[#per_lane + 1] = lane
  per_lane[#per_lane + 1] = count
end
local waiting, waiting_per_lane = 0, {}
for j = 2, 1 + 2 * tonumber(ARGV[1]), 2 do
  local count = lane_waiting(ARGV[j], ARGV[j + 1] == '1')
  waiting = waiting + count
  waiting_per_lane[#waiting_per_lane + 1] = ARGV[j]
  waiting_per_lane[#waiting_per_lane + 1] = count
end
-- A lease's first two fields are its lane and tenant; fields added after them are ignored.
local tenants = {}
for _, replica in ipairs(live) do
  for _, packed in ipairs(redis.call('HVALS', base .. 'lease:' .. replica)) do
    local lane, tenant = cmsgpack.unpack(packed)
    local of_tenant = tenants[tenant]
    if of_tenant == nil then
      of_tenant = {}
      tenants[tenant] = of_tenant
    end
    of_tenant[lane] = (of_tenant[lane] or 0) + 1
  end
end
local per_tenant = {}
for tenant, of_tenant in pairs(tenants) do
  for lane, count in pairs(of_tenant) do
    per_tenant[#per_tenant + 1] = tenant
    per_tenant[#per_tenant + 1] = lane
    per_tenant[#per_tenant + 1] = count
  end
end
return {running, tokens, waiting, #live, per_lane, waiting_per_lane, per_tenant}

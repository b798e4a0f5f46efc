-- ARGV: lane count, then lane count × (name, fair 0|1).
-- Returns {running, tokens, waiting, live replicas, {lane, running}*, {lane, waiting}*}.
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
return {running, tokens, waiting, #live, per_lane, waiting_per_lane}

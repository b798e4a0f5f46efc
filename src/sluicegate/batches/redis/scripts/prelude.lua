-- Prepended to every batch script. KEYS[1] is the base of every batch key, "{<prefix>:batch}:"
-- (one hash tag: every key is in one slot, so a script builds the names of the keys it
-- touches from the base); the key layout is in redis_batches.py.
local B = KEYS[1]
local ACTIVE = {validating = true, in_progress = true, finalizing = true, cancelling = true}
local function move(id, from, to)
  local bk = B .. 'b:' .. id
  local seq = redis.call('HGET', bk, 'seq')
  redis.call('HSET', bk, 'status', to)
  redis.call('ZREM', B .. 'st:' .. from, id)
  if ACTIVE[to] then redis.call('ZADD', B .. 'st:' .. to, seq, id) end
  redis.call('HINCRBY', B .. 'nstatus', from, -1)
  redis.call('HINCRBY', B .. 'nstatus', to, 1)
end
local function split(member)
  local id, idx = string.match(member, '^(.*)|(%d+)$')
  return id, tostring(tonumber(idx))
end
local function member(id, idx)
  return id .. '|' .. string.format('%08d', tonumber(idx))
end
local function unqueue(id, idx)
  -- take a line out of whichever queue holds it; its state before ('r', 'q' or nil)
  local model = redis.call('HGET', B .. 'model:' .. id, idx)
  if not model then return nil, nil end
  local m = member(id, idx)
  if redis.call('ZREM', B .. 'leased:' .. model, m) == 1 then return 'r', model end
  local queued = redis.call('ZREM', B .. 'ready:' .. model, m)
  queued = queued + redis.call('ZREM', B .. 'delayed:' .. model, m)
  if queued > 0 then return 'q', model end
  return nil, model
end
local function turn_entry(tenant, seq, id)
  -- a batch in its model's rotation (turns:<model>, claim.lua): its tenant's name in hex (so
  -- entries sort by tenant as SQLite sorts names, and '/' ends the name), its age, its id
  local name = string.gsub(tenant, '.', function(c) return string.format('%02x', string.byte(c)) end)
  return name .. '/' .. string.format('%012d', tonumber(seq)) .. '/' .. id
end

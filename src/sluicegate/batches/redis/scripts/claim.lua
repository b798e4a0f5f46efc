-- ARGV: model, owner, limit, now, lease end. Delayed lines now due become ready; then up to
-- limit lines are leased to owner, those whose lease ran out first, then ready ones in turn:
-- round-robin across tenants, then across each tenant's batches, as the SQLite backend does
-- (sqlite/line_turns.py). Each {batch id, index, custom_id, body, failed attempts}.
--
-- turns:<model> holds an entry per batch that may have ready lines (turn_entry: sorted by
-- tenant, then age); turn:<model> where the rotation stands: 't' the tenant served last
-- (its name in hex), per tenant the entry of the batch it was last served from, and 'v'
-- once the batches made ready before the turns existed were given theirs.
local model, owner = ARGV[1], ARGV[2]
local limit, now, until_ = tonumber(ARGV[3]), ARGV[4], ARGV[5]
local ready, delayed = B .. 'ready:' .. model, B .. 'delayed:' .. model
local leased = B .. 'leased:' .. model
local turns, turn = B .. 'turns:' .. model, B .. 'turn:' .. model
for _, m in ipairs(redis.call('ZRANGEBYSCORE', delayed, '-inf', now, 'LIMIT', 0, 1000)) do
  local id = split(m)
  redis.call('ZREM', delayed, m)
  local batch = redis.call('HMGET', B .. 'b:' .. id, 'seq', 'tenant')
  if batch[1] then
    redis.call('ZADD', ready, batch[1], m)
    redis.call('ZADD', turns, 0, turn_entry(batch[2], batch[1], id))
  end
end
local out = {}
local function take(m, from)
  -- 'taken'; or 'batch' (it no longer runs) or 'line' (it has a result): m leaves from
  local id, idx = split(m)
  local bk = B .. 'b:' .. id
  if redis.call('HGET', bk, 'status') ~= 'in_progress' or redis.call('HEXISTS', bk, 'ending') == 1
  then
    redis.call('ZREM', from, m)
    return 'batch'
  end
  if redis.call('HEXISTS', B .. 'res:' .. id, idx) == 1 then
    redis.call('ZREM', from, m)
    return 'line'
  end
  if from == ready then
    redis.call('ZREM', ready, m)
    redis.call('HINCRBY', B .. 'n:' .. id, 'q|' .. model, -1)
    redis.call('HINCRBY', B .. 'n:' .. id, 'r|' .. model, 1)
  end
  redis.call('ZADD', leased, until_, m)
  redis.call('HSET', B .. 'own:' .. id, idx, owner)
  out[#out + 1] = {
    id, idx, redis.call('HGET', B .. 'cid:' .. id, idx),
    redis.call('HGET', B .. 'body:' .. id, idx),
    redis.call('HGET', B .. 'att:' .. id, idx) or '0'
  }
  return 'taken'
end
local function drop(seq)
  -- up to 1000 ready lines of a batch that no longer runs go; whether that was all of them
  local gone = redis.call('ZRANGEBYSCORE', ready, seq, seq, 'LIMIT', 0, 1000)
  if #gone > 0 then redis.call('ZREM', ready, unpack(gone)) end
  return #gone < 1000
end
for _, m in ipairs(redis.call('ZRANGEBYSCORE', leased, '-inf', '(' .. now, 'LIMIT', 0, limit)) do
  take(m, leased)
end
if redis.call('HSETNX', turn, 'v', 1) == 1 then
  -- the model's first claim since the turns exist: each batch with ready lines joins them
  local from = '-inf'
  while true do
    local m = redis.call('ZRANGEBYSCORE', ready, from, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    if not m[1] then break end
    local id = split(m[1])
    local tenant = redis.call('HGET', B .. 'b:' .. id, 'tenant')
    if tenant then redis.call('ZADD', turns, 0, turn_entry(tenant, m[2], id)) end
    from = '(' .. m[2]
  end
end
-- The batch of the oldest ready line is in the rotation (one an older replica made ready,
-- during a rolling upgrade, joins it), and the lines of a batch that is gone are dropped.
local head = redis.call('ZRANGE', ready, 0, 0, 'WITHSCORES')
if head[1] then
  local id = split(head[1])
  local tenant = redis.call('HGET', B .. 'b:' .. id, 'tenant')
  if tenant then
    redis.call('ZADD', turns, 0, turn_entry(tenant, head[2], id))
  else
    drop(head[2])
  end
end
local empty = {}
local function first(from, to)
  -- the first entry between from and to; a range found empty stays so (the loop only removes)
  local range = from .. '\n' .. to
  if empty[range] then return nil end
  local found = redis.call('ZRANGEBYLEX', turns, from, to, 'LIMIT', 0, 1)[1]
  if not found then empty[range] = true end
  return found
end
local last, served, moved = redis.call('HGET', turn, 't'), {}, {}
local looked = 0
while #out < limit and looked < 10 * limit + 1000 do
  looked = looked + 1
  -- the next tenant ('0' is just above the '/' that ends each of last's entries), wrapping
  local entry = last and first('(' .. last .. '0', '+') or first('-', '+')
  if not entry then break end
  local tenant = string.match(entry, '^(%x*)/')
  if served[tenant] == nil then served[tenant] = redis.call('HGET', turn, tenant) or false end
  if served[tenant] then
    -- entry is the tenant's oldest batch: its next one, if any, comes before it
    entry = first('(' .. served[tenant], '(' .. tenant .. '0') or entry
  end
  local seq = string.match(entry, '/(%d+)/')
  local m = redis.call('ZRANGEBYSCORE', ready, seq, seq, 'LIMIT', 0, 1)[1]
  local got = m and take(m, ready)
  if not m or (got == 'batch' and drop(seq)) then
    redis.call('ZREM', turns, entry)
  elseif got == 'taken' then
    last, served[tenant], moved[tenant] = tenant, entry, true
  end
end
-- written only when it moved: an idle claim writes nothing (nor to the append-only file)
for tenant in pairs(moved) do redis.call('HSET', turn, tenant, served[tenant]) end
if next(moved) then redis.call('HSET', turn, 't', last) end
return out

"""The Lua scripts of ``RedisBatches``: every change of a batch's or a line's state.

Each script runs atomically in Redis, so a status moves from one value to the
next in exactly one replica (a compare-and-set on the status), and a line's
first result wins (``HSETNX``). ``KEYS[1]`` is the base of every batch key,
``{<prefix>:batch}:`` (one hash tag: every key is in one slot, so a script may
build the names of the keys it touches from the base). The key layout is
described in ``redis_backend``.
"""

from __future__ import annotations

PRELUDE = """
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
"""

CREATE = """
-- ARGV: kind, id, tenant, quota ('' none: active batches; a file's was reserved), expires_at
-- ('' none), then the fields. A file is its reservation made real (false if it was swept);
-- a batch is refused past the tenant's active batches: {'active_batches', soonest end}.
local kind, id, tenant, quota, expires = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local fields = {}
for i = 6, #ARGV do fields[#fields + 1] = ARGV[i] end
local seq
if kind == 'file' then
  if redis.call('HDEL', B .. 'uploads', id) == 0 then return false end
  redis.call('HINCRBY', B .. 'usage:' .. tenant, 'pending', -1)
  redis.call('ZREM', B .. 'upload_at', id)
  seq = redis.call('INCR', B .. 'seq')
  redis.call('HSET', B .. 'f:' .. id, 'seq', seq, unpack(fields))
  redis.call('PERSIST', B .. 'fl:' .. id)
  redis.call('ZADD', B .. 'files:' .. tenant, seq, id)
  if expires ~= '' then
    redis.call('ZADD', B .. 'fexp', expires, id)
    redis.call('ZADD', B .. 'fexp:' .. tenant, expires, id)
  end
else
  local active = B .. 'active:' .. tenant
  if quota ~= '' and redis.call('ZCARD', active) >= tonumber(quota) then
    local first = redis.call('ZRANGE', active, 0, 0, 'WITHSCORES')
    return {'active_batches', first[2] or ''}
  end
  seq = redis.call('INCR', B .. 'seq')
  redis.call('HSET', B .. 'b:' .. id, 'seq', seq, unpack(fields))
  redis.call('ZADD', B .. 'batches:' .. tenant, seq, id)
  redis.call('ZADD', B .. 'st:validating', seq, id)
  redis.call('HINCRBY', B .. 'nstatus', 'validating', 1)
  redis.call('ZADD', active, expires, id)
end
return seq
"""

DELETE_FILE = """
-- ARGV: id, tenant, due: '' deletes the tenant's file; a time deletes the file (whoever's)
-- if it expired by then
local id, tenant, due = ARGV[1], ARGV[2], ARGV[3]
local fk = B .. 'f:' .. id
local owner = redis.call('HGET', fk, 'tenant')
if due ~= '' then
  if not owner then
    redis.call('ZREM', B .. 'fexp', id)
    return 0
  end
  local at = redis.call('HGET', fk, 'expires_at')
  if not at or tonumber(at) > tonumber(due) then return 0 end
  tenant = owner
end
if owner ~= tenant then return 0 end
local size = tonumber(redis.call('HGET', fk, 'bytes') or '0')
-- Deletes first: at maxmemory Redis refuses a script's first write that may grow memory
-- (HINCRBY), but not later ones, so a full store can still delete files to make room.
redis.call('DEL', fk)
redis.call('UNLINK', B .. 'fl:' .. id)
redis.call('ZREM', B .. 'files:' .. tenant, id)
redis.call('ZREM', B .. 'fexp', id)
redis.call('ZREM', B .. 'fexp:' .. tenant, id)
-- a file stored before quotas existed was never counted: the counter stops at 0
if redis.call('HINCRBY', B .. 'usage:' .. tenant, 'bytes', -size) < 0 then
  redis.call('HSET', B .. 'usage:' .. tenant, 'bytes', 0)
end
return 1
"""

CANCEL = """
local id, tenant, now = ARGV[1], ARGV[2], ARGV[3]
local bk = B .. 'b:' .. id
if redis.call('HGET', bk, 'tenant') ~= tenant then return 0 end
local status = redis.call('HGET', bk, 'status')
if (status == 'validating' or status == 'in_progress')
    and redis.call('HEXISTS', bk, 'ending') == 0 then
  move(id, status, 'cancelling')
  redis.call('HSET', bk, 'cancelling_at', now)
  redis.call('ZREM', B .. 'expiry', id)
  redis.call('ZREM', B .. 'full', id)
end
return 1
"""

CLAIM = """
local model, owner = ARGV[1], ARGV[2]
local limit, now, until_ = tonumber(ARGV[3]), ARGV[4], ARGV[5]
local ready, delayed = B .. 'ready:' .. model, B .. 'delayed:' .. model
local leased = B .. 'leased:' .. model
for _, m in ipairs(redis.call('ZRANGEBYSCORE', delayed, '-inf', now, 'LIMIT', 0, 1000)) do
  local id = split(m)
  redis.call('ZREM', delayed, m)
  local seq = redis.call('HGET', B .. 'b:' .. id, 'seq')
  if seq then redis.call('ZADD', ready, seq, m) end
end
local out = {}
local function take(m, from)
  local id, idx = split(m)
  local bk = B .. 'b:' .. id
  if redis.call('HGET', bk, 'status') ~= 'in_progress' or redis.call('HEXISTS', bk, 'ending') == 1
      or redis.call('HEXISTS', B .. 'res:' .. id, idx) == 1 then
    redis.call('ZREM', from, m)
    return
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
end
for _, m in ipairs(redis.call('ZRANGEBYSCORE', leased, '-inf', '(' .. now, 'LIMIT', 0, limit)) do
  take(m, leased)
end
local looked = 0
while #out < limit and looked < 10 * limit + 1000 do
  local heads = redis.call('ZRANGE', ready, 0, limit - #out - 1)
  if #heads == 0 then break end
  for _, m in ipairs(heads) do take(m, ready) end
  looked = looked + #heads
end
return out
"""

RENEW = """
local owner, until_ = ARGV[1], ARGV[2]
for i = 3, #ARGV, 3 do
  local model, id, idx = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if redis.call('HGET', B .. 'own:' .. id, idx) == owner then
    redis.call('ZADD', B .. 'leased:' .. model, 'XX', until_, member(id, idx))
  end
end
return 0
"""

RECORD = """
local owner, nresults = ARGV[1], tonumber(ARGV[2])
local i = 3
for _ = 1, nresults do
  local id, idx, ok, text = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local prompt, completion = tonumber(ARGV[i + 4]), tonumber(ARGV[i + 5])
  i = i + 6
  local bk, nk = B .. 'b:' .. id, B .. 'n:' .. id
  local status = redis.call('HGET', bk, 'status')
  local open = (status == 'in_progress' or status == 'cancelling')
    and redis.call('HEXISTS', bk, 'ending') == 0
    and redis.call('HEXISTS', B .. 'model:' .. id, idx) == 1
  if open and redis.call('HSETNX', B .. 'res:' .. id, idx, ok .. text) == 1 then
    local was, model = unqueue(id, idx)
    if was then redis.call('HINCRBY', nk, was .. '|' .. model, -1) end
    local word = ok == '1' and 'completed' or 'failed'
    redis.call('HINCRBY', nk, string.sub(word, 1, 1) .. '|' .. model, 1)
    redis.call('HINCRBY', nk, word, 1)
    redis.call('HINCRBY', nk, 'prompt_tokens', prompt)
    redis.call('HINCRBY', nk, 'completion_tokens', completion)
    local done = redis.call('HINCRBY', nk, 'done', 1)
    if status == 'in_progress' and done >= tonumber(redis.call('HGET', bk, 'total')) then
      redis.call('ZADD', B .. 'full', redis.call('HGET', bk, 'seq'), id)
    end
  elseif not open then
    unqueue(id, idx)
  end
  if redis.call('HGET', B .. 'own:' .. id, idx) == owner then
    redis.call('HDEL', B .. 'own:' .. id, idx)
  end
end
while i <= #ARGV do
  local id, idx, not_before, failed = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  i = i + 4
  local model = redis.call('HGET', B .. 'model:' .. id, idx)
  local m = member(id, idx)
  if model and redis.call('HGET', B .. 'own:' .. id, idx) == owner
      and redis.call('ZREM', B .. 'leased:' .. model, m) == 1 then
    redis.call('HDEL', B .. 'own:' .. id, idx)
    redis.call('ZADD', B .. 'delayed:' .. model, not_before, m)
    redis.call('HINCRBY', B .. 'n:' .. id, 'r|' .. model, -1)
    redis.call('HINCRBY', B .. 'n:' .. id, 'q|' .. model, 1)
    if failed == '1' then redis.call('HINCRBY', B .. 'att:' .. id, idx, 1) end
  end
end
return 0
"""

BEGIN_CHECK = """
local id, token, now, until_ = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local bk = B .. 'b:' .. id
if redis.call('HGET', bk, 'status') ~= 'validating' then return false end
local held = redis.call('HGET', bk, 'checker_until')
if held and tonumber(held) >= now then return false end
redis.call('HSET', bk, 'checker', token, 'checker_until', until_)
return redis.call('HMGET', bk, 'endpoint', 'lane', 'input_file_id')
"""

END_CHECK = """
-- ARGV: id, token, now, total, errors JSON ('' when the lines run), error lines, then per model:
-- name, runnable lines
local id, token, now, total, errors, failed = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local bk, stage = B .. 'b:' .. id, B .. 'stage:' .. ARGV[2] .. ':'
if redis.call('HGET', bk, 'status') ~= 'validating'
    or redis.call('HGET', bk, 'checker') ~= token then
  return 0
end
redis.call('HDEL', bk, 'checker', 'checker_until')
if errors ~= '' then
  move(id, 'validating', 'failed')
  redis.call('HSET', bk, 'failed_at', now, 'errors', errors)
  redis.call('ZREM', B .. 'active:' .. redis.call('HGET', bk, 'tenant'), id)
  redis.call('ZADD', B .. 'ended', now, id)
  return 1
end
for _, name in ipairs({'body', 'cid', 'model', 'res'}) do
  if redis.call('EXISTS', stage .. name) == 1 then
    redis.call('RENAME', stage .. name, B .. name .. ':' .. id)
    redis.call('PERSIST', B .. name .. ':' .. id)
  end
end
local seq, nk = redis.call('HGET', bk, 'seq'), B .. 'n:' .. id
for i = 7, #ARGV, 2 do
  local model, staged = ARGV[i], stage .. 'ready:' .. ARGV[i]
  local n = redis.call('ZCARD', staged)
  for start = 0, n - 1, 1000 do
    local args = {}
    for _, m in ipairs(redis.call('ZRANGE', staged, start, start + 999)) do
      args[#args + 1] = seq
      args[#args + 1] = m
    end
    redis.call('ZADD', B .. 'ready:' .. model, unpack(args))
  end
  redis.call('DEL', staged)
  redis.call('HSET', nk, 'q|' .. model, ARGV[i + 1])
end
redis.call('HSET', nk, 'failed', failed, 'done', failed)
move(id, 'validating', 'in_progress')
redis.call('HSET', bk, 'in_progress_at', now, 'total', total)
redis.call('ZADD', B .. 'expiry', redis.call('HGET', bk, 'expires_at'), id)
return 1
"""

BEGIN_END = """
local id, kind, now = ARGV[1], ARGV[2], tonumber(ARGV[3])
local bk = B .. 'b:' .. id
local status = redis.call('HGET', bk, 'status')
if redis.call('HEXISTS', bk, 'ending') == 1 then return 0 end
if kind == 'cancelled' then
  if status ~= 'cancelling' then return 0 end
elseif status ~= 'in_progress' then
  return 0
elseif kind == 'expired' then
  if tonumber(redis.call('HGET', bk, 'expires_at')) > now then return 0 end
else
  local done = tonumber(redis.call('HGET', B .. 'n:' .. id, 'done') or '0')
  if done < tonumber(redis.call('HGET', bk, 'total')) then return 0 end
  move(id, 'in_progress', 'finalizing')
  redis.call('HSET', bk, 'finalizing_at', now)
end
redis.call('HSET', bk, 'ending', kind)
redis.call('ZREM', B .. 'expiry', id)
redis.call('ZREM', B .. 'full', id)
redis.call('ZADD', B .. 'ending', redis.call('HGET', bk, 'seq'), id)
return 1
"""

END = """
-- ARGV: id, kind, now, then for the output and the error file: id, lines, bytes; then when
-- the files expire ('' never)
local id, kind, now, expires = ARGV[1], ARGV[2], ARGV[3], ARGV[10]
local bk, nk = B .. 'b:' .. id, B .. 'n:' .. id
if redis.call('HGET', bk, 'ending') ~= kind then return 0 end
local tenant = redis.call('HGET', bk, 'tenant')
local files = {{ARGV[4], ARGV[5], ARGV[6], 'output', 'output_file_id'},
               {ARGV[7], ARGV[8], ARGV[9], 'errors', 'error_file_id'}}
for _, f in ipairs(files) do
  if tonumber(f[2]) > 0 then
    local seq = redis.call('INCR', B .. 'seq')
    redis.call('HSET', B .. 'f:' .. f[1], 'seq', seq, 'id', f[1], 'tenant', tenant,
      'purpose', 'batch_output', 'filename', id .. '_' .. f[4] .. '.jsonl', 'bytes', f[3],
      'lines', f[2], 'created_at', now)
    redis.call('PERSIST', B .. 'fl:' .. f[1])
    redis.call('ZADD', B .. 'files:' .. tenant, seq, f[1])
    redis.call('HSET', bk, f[5], f[1])
    redis.call('HINCRBY', B .. 'usage:' .. tenant, 'bytes', f[3])
    if expires ~= '' then
      redis.call('HSET', B .. 'f:' .. f[1], 'expires_at', expires)
      redis.call('ZADD', B .. 'fexp', expires, f[1])
      redis.call('ZADD', B .. 'fexp:' .. tenant, expires, f[1])
    end
  end
end
local total = tonumber(redis.call('HGET', bk, 'total') or '0')
local completed = tonumber(redis.call('HGET', nk, 'completed') or '0')
if total > 0 then redis.call('HSET', nk, 'failed', total - completed, 'done', total) end
move(id, redis.call('HGET', bk, 'status'), kind)
redis.call('HSET', bk, kind .. '_at', now)
redis.call('HDEL', bk, 'ending')
redis.call('ZREM', B .. 'ending', id)
redis.call('ZREM', B .. 'active:' .. tenant, id)
redis.call('ZADD', B .. 'ended', now, id)
for _, name in ipairs({'body', 'cid', 'model', 'att', 'own', 'res'}) do
  redis.call('UNLINK', B .. name .. ':' .. id)
end
return 1
"""

SCRIPTS = {
    "CREATE": CREATE,
    "DELETE_FILE": DELETE_FILE,
    "CANCEL": CANCEL,
    "CLAIM": CLAIM,
    "RENEW": RENEW,
    "RECORD": RECORD,
    "BEGIN_CHECK": BEGIN_CHECK,
    "END_CHECK": END_CHECK,
    "BEGIN_END": BEGIN_END,
    "END": END,
}
"""Every script by name (each runs after ``PRELUDE``)."""

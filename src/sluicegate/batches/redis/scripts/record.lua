-- ARGV: owner, result count, then per result: batch id, index, ok (1|0), text, prompt tokens,
-- completion tokens; then per retry: batch id, index, not_before, failed (1|0). A line's
-- first result wins; a retried line that owner still holds waits in delayed:<model>.
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

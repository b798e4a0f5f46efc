-- KEYS[1]: the tenant's bucket hash; KEYS[2] (optional): this take's record, which makes a
-- retried take answer what the first attempt did instead of charging twice. ARGV:
-- requests_per_s ('' for none), burst_requests, tokens_per_s ('' for none), burst_tokens,
-- tokens. TokenBucket/TenantRateLimiter of core/ratelimit.py on Redis time: returns the wait
-- in seconds as a string, "0" when taken.
if KEYS[2] then
  local done = redis.call('GET', KEYS[2])
  if done then return done end
end
local SLACK_S = 1e-6
local now = now_s()
local state = redis.call('HMGET', KEYS[1], 'rl', 'rt', 'tl', 'tt')

local function wait_time(amount, level, rate, burst)
  local need = amount
  if need >= burst then need = burst end
  local deficit = need - level
  if deficit <= rate * SLACK_S then return 0 end
  return deficit / rate
end

local request_rate, token_rate = tonumber(ARGV[1]), tonumber(ARGV[3])
local request_burst, token_burst = tonumber(ARGV[2]), tonumber(ARGV[4])
local tokens = tonumber(ARGV[5])
local wait, refill_s = 0, 0
local fields = {}
local request_level, request_last, token_level, token_last
if request_rate then
  request_level, request_last = refill(state[1], state[2], request_rate, request_burst, now)
  wait = wait_time(1, request_level, request_rate, request_burst)
end
if token_rate then
  token_level, token_last = refill(state[3], state[4], token_rate, token_burst, now)
  local token_wait = wait_time(tokens, token_level, token_rate, token_burst)
  if token_wait > wait then wait = token_wait end
end
if wait == 0 then
  if request_rate then request_level = request_level - 1 end
  if token_rate then token_level = token_level - tokens end
end
if request_rate then
  for _, value in ipairs({'rl', fmt(request_level), 'rt', fmt(request_last)}) do
    fields[#fields + 1] = value
  end
  refill_s = (request_burst - request_level) / request_rate
end
if token_rate then
  for _, value in ipairs({'tl', fmt(token_level), 'tt', fmt(token_last)}) do
    fields[#fields + 1] = value
  end
  local token_refill_s = (token_burst - token_level) / token_rate
  if token_refill_s > refill_s then refill_s = token_refill_s end
end
redis.call('HSET', KEYS[1], unpack(fields))
-- Once refilled to the burst the state equals a fresh (full) bucket's, so it may expire then.
redis.call('PEXPIRE', KEYS[1], math.ceil(refill_s * 1000) + 1000)
if KEYS[2] then redis.call('SET', KEYS[2], fmt(wait), 'PX', 60000) end
return fmt(wait)

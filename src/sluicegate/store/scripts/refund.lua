-- KEYS[1]: the tenant's bucket hash. ARGV: tokens_per_s, burst_tokens, tokens (> 0).
-- Gives tokens back to the token bucket, capped at its burst (TokenBucket.refund). A
-- missing bucket is full; the key's expiry stays, as a refund only shortens the refill.
local rate, burst, tokens = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local state = redis.call('HMGET', KEYS[1], 'tl', 'tt')
if state[1] == false then return 0 end
local level, last = refill(state[1], state[2], rate, burst, now_s())
level = level + tokens
if level >= burst then level = burst end
redis.call('HSET', KEYS[1], 'tl', fmt(level), 'tt', fmt(last))
return 1

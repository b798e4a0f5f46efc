-- ARGV: id, token, now, lease end. Takes a validating batch no other checker holds: its
-- endpoint, lane and input file id (false if it is not taken).
local id, token, now, until_ = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local bk = B .. 'b:' .. id
if redis.call('HGET', bk, 'status') ~= 'validating' then return false end
local held = redis.call('HGET', bk, 'checker_until')
if held and tonumber(held) >= now then return false end
redis.call('HSET', bk, 'checker', token, 'checker_until', until_)
return redis.call('HMGET', bk, 'endpoint', 'lane', 'input_file_id')

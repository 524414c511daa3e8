-- An impression counted without screening: the daily window, the sliding
-- window and the budget's token bucket. ARGV: user, campaign, member id,
-- sliding window (ms), cost, budget amount per day. Answers 1.
local user, c, member = ARGV[1], ARGV[2], ARGV[3]
local win, cost, amount = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local day = math.floor(tonumber(t[1]) / 86400)
local fk = 'fx:' .. user .. ':' .. c .. ':' .. day
if redis.call('INCR', fk) == 1 then redis.call('EXPIRE', fk, 86400) end
local zk = 'rz:' .. user .. ':' .. c
redis.call('ZADD', zk, now, member)
redis.call('PEXPIRE', zk, win)
local bk = 'bud:' .. c
local b = redis.call('HMGET', bk, 'tokens', 'ts')
local tokens, ts = tonumber(b[1]), tonumber(b[2])
if tokens == nil then tokens, ts = amount, now end
tokens = math.min(amount, tokens + (now - ts) * amount / 86400000) - cost
redis.call('HSET', bk, 'tokens', string.format('%.3f', tokens), 'ts', now)
return 1

-- The auction's outcome: the winner pays from its budget (a token bucket
-- refilled at amount per day), the other held candidates are released
-- (their daily count decremented, their ZSET entry removed).
-- ARGV: user, request id, winner, cost, budget amount per day, then the
-- losing (held) campaign ids. Answers 1 if the budget paid, else 0.
local user, rid, winner = ARGV[1], ARGV[2], ARGV[3]
local cost, amount = tonumber(ARGV[4]), tonumber(ARGV[5])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local day = math.floor(tonumber(t[1]) / 86400)
-- token bucket
local bk = 'bud:' .. winner
local b = redis.call('HMGET', bk, 'tokens', 'ts')
local tokens, ts = tonumber(b[1]), tonumber(b[2])
if tokens == nil then tokens, ts = amount, now end
tokens = math.min(amount, tokens + (now - ts) * amount / 86400000)
local paid = 0
if tokens >= cost then
  tokens = tokens - cost
  paid = 1
end
redis.call('HSET', bk, 'tokens', string.format('%.3f', tokens), 'ts', now)
if paid == 0 then
  -- not paid: the winner's hold is released too
  redis.call('DECR', 'fx:' .. user .. ':' .. winner .. ':' .. day)
  redis.call('ZREM', 'rz:' .. user .. ':' .. winner, rid)
end
for i = 6, #ARGV do
  local c = ARGV[i]
  redis.call('DECR', 'fx:' .. user .. ':' .. c .. ':' .. day)
  redis.call('ZREM', 'rz:' .. user .. ':' .. c, rid)
end
return paid

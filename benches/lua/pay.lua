-- The auction's outcome on a Redis Cluster, campaign side: the winner pays
-- from its budget (the token bucket of commit.lua), on the budget's own key
-- (its own slot: a script may not touch keys of two slots). KEYS[1]: the
-- budget key 'bud:<campaign>'. ARGV: cost, budget amount per day. Answers 1
-- if the budget paid, else 0; the caller then releases the user's holds
-- (release.lua), the winner's too if unpaid.
local bk = KEYS[1]
local cost, amount = tonumber(ARGV[1]), tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
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
return paid

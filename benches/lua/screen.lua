-- Screening as the common recipes do it: one script per ad request that
-- checks K campaigns' per-user caps and increments (holds) every eligible
-- one: a fixed daily window (INCR/EXPIRE) and a sliding window (a ZSET of
-- request ids scored by time). ARGV: user, request id, daily limit, sliding
-- limit, sliding window (ms), K, then K campaign ids. Answers a string of K
-- '1'/'0' flags, in candidate order.
local user, rid = ARGV[1], ARGV[2]
local daily, roll, win = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local n = tonumber(ARGV[6])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local day = math.floor(tonumber(t[1]) / 86400)
local out = {}
for i = 1, n do
  local c = ARGV[6 + i]
  local fk = 'fx:' .. user .. ':' .. c .. ':' .. day
  local zk = 'rz:' .. user .. ':' .. c
  local used = tonumber(redis.call('GET', fk) or '0')
  local ok = used < daily
  if ok then
    redis.call('ZREMRANGEBYSCORE', zk, '-inf', now - win)
    ok = redis.call('ZCARD', zk) < roll
  end
  if ok then
    if redis.call('INCR', fk) == 1 then redis.call('EXPIRE', fk, 86400) end
    redis.call('ZADD', zk, now, rid)
    redis.call('PEXPIRE', zk, win)
    out[i] = '1'
  else
    out[i] = '0'
  end
end
return table.concat(out)

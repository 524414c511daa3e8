-- GCRA, the algorithm and answer of redis-cell's CL.THROTTLE, in Lua
-- (the common "redis-gcra" recipe). KEYS[1] the key; ARGV: max_burst,
-- count, period (s), quantity. Answers {limited, limit, remaining,
-- retry_after_s, reset_after_s} like CL.THROTTLE; the state is one string
-- (the theoretical arrival time, µs) expiring when the key is full again.
local burst = tonumber(ARGV[1])
local count = tonumber(ARGV[2])
local period = tonumber(ARGV[3])
local quantity = tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local emission = period * 1000000 / count
local tolerance = emission * (burst + 1)
local tat = tonumber(redis.call('GET', KEYS[1]))
if tat == nil or tat < now then tat = now end
local new_tat = tat + emission * quantity
local allow_at = new_tat - tolerance
local diff = now - allow_at
if diff < 0 then
  local retry = -1
  if quantity <= burst + 1 then retry = math.ceil(-diff / 1000000) end
  local remaining = math.floor((now - (tat - tolerance)) / emission)
  if remaining < 0 then remaining = 0 end
  return {1, burst + 1, remaining, retry, math.ceil((tat - now) / 1000000)}
end
local reset = new_tat - now
redis.call('SET', KEYS[1], string.format('%.0f', new_tat), 'PX', math.max(1, math.ceil(reset / 1000)))
return {0, burst + 1, math.floor(diff / emission), -1, math.ceil(reset / 1000000)}

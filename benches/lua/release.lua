-- The auction's outcome on a Redis Cluster, user side: the held candidates
-- that did not win (and the winner, if its budget did not pay) are released:
-- their daily count decremented, their ZSET entry removed. The user is
-- hash-tagged ('{u...}'), so every key here is in the user's slot, KEYS[1]
-- any of them. ARGV: user, request id, then the released campaign ids.
local user, rid = ARGV[1], ARGV[2]
local day = math.floor(tonumber(redis.call('TIME')[1]) / 86400)
for i = 3, #ARGV do
  local c = ARGV[i]
  redis.call('DECR', 'fx:' .. user .. ':' .. c .. ':' .. day)
  redis.call('ZREM', 'rz:' .. user .. ':' .. c, rid)
end
return #ARGV - 2

#!lua name=freqcap_v1
--
-- freqcap's Redis Functions library (Redis >= 7.0). Loaded by freqcap on every
-- cluster master with `FUNCTION LOAD REPLACE`; replicas receive it through
-- replication and it persists in RDB/AOF, unlike EVALSHA scripts, which a
-- promoted replica would not have.
--
-- The library is generic: it knows versions, opaque blobs and units, nothing
-- of rate limits. A function's name carries its reply contract (`_v1`); a
-- change of arguments or reply shape gets a new name, so nodes of two releases
-- can share one cluster while a rolling upgrade loads a library with both.
--
-- Numbers. Lua numbers are IEEE doubles: integers are exact up to 2^53 - 1
-- (9 007 199 254 740 991). Versions are microsecond timestamps (~1.8e15 in
-- 2027, ~2^53 in the year 2255) and every other count is validated to stay
-- at or below 2^53 - 1. A Lua number in a reply becomes an integer reply by
-- truncation, so every number returned here is made integral first.
--
-- Time. The functions read the Redis server clock with TIME. Redis 7.0
-- replicates the effects of a script (the HSET/PEXPIREAT it ran), never the
-- script itself, so a replica or an AOF replay never re-reads the clock.
--
-- What each function promises (its own header gives arguments and replies):
--   fc_cas_v1         a record is written only over the version the writer
--                     read; a conflict returns the current record (no ABA:
--                     versions never repeat, even after expiry)
--   fc_cas_v2         the same, refused to an owner a later epoch deposed
--   fc_cas_v3         fc_cas_v1, refused while the record is frozen by
--                     fc_hot_v1 (its blob then never changes)
--   fc_hot_v1         freezes a hot key's record once, atomically with what
--                     it holds: every node seeds its leases from one copy
--   fc_own_v1         a new owner's claim moves the version: no write made
--                     on an older copy lands after it
--   fc_member_v1      a joiner owns nothing before every live member has
--                     read it; an ended lease is refused, never renewed
--   fc_heat_v1        one table of the heaviest users for the whole fleet,
--                     applied ahead of time so every node places alike
--   fc_peek_v1        whether a copy is current, the record only if it moved
--   fc_lease_v1/v2    Σ spent + Σ headroom <= total, at Redis's time; counts
--                     absolute, so a retry or a lost reply grants nothing
--                     twice; a dead holder's headroom comes back, its spend
--                     stays counted
--   fc_line_v1        a campaign-scope rate leased in units: the fleet never
--                     admits more than the line's stated bound
--   fc_plan_v1        one adaptive pacing plan per slice for the whole fleet
--   fc_slots_v1       Σ granted slots <= max; a stale call changes nothing
--   fc_slots_v2       the same, and the holder's fair share (its target)
--   fc_line_cap_v1    caps a token line's Σ granted, and reads it
--   fc_slots_cap_v1   caps a slots lease's Σ granted, and reads it
--   fc_lease_read_v1  read-only, deterministic field order (replicas too)
--   fc_defs_v1        a batch of definitions all or nothing, checked before
--                     the first write, refused on a stale version or to a
--                     node that lost the writer lock
--   fc_writer_v1      at most one definitions writer at a time

local MAX_INT = 9007199254740991 -- 2^53 - 1: the largest integer a double holds exactly

-- Parses a non-negative decimal integer argument. Strict on purpose: Lua's
-- tonumber also accepts "1e3", "0x10" and " 5", which would hide a caller bug.
-- Returns the number, or nil and an error reply naming the argument.
local function uint_arg(value, fname, aname)
  if type(value) ~= 'string' or not string.match(value, '^%d+$')
     or #value > 16 or tonumber(value) > MAX_INT then
    return nil, redis.error_reply('ERR ' .. fname .. ': ' .. aname ..
      ' must be a non-negative integer <= 2^53-1')
  end
  return tonumber(value)
end

-- Formats an integral number for a Redis command argument. redis.call turns a
-- Lua number into "%.17g", which is exact but reads oddly; this makes the
-- stored field a plain decimal integer every client parses.
local function istr(n)
  return string.format('%.0f', n)
end

-- Server time: {unix seconds, microseconds} as strings.
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-------------------------------------------------------------------------------
-- fc_cas_v1: compare-and-set of a versioned blob.
--
--   FCALL fc_cas_v1 1 K expected_version blob expire_at_ms
--
-- K is a hash {v = version, b = blob}. expected_version "0" means "K is absent
-- (or has version 0)". expire_at_ms is a unix time in ms for PEXPIREAT; "0"
-- removes any expiry.
--
-- Reply:
--   [1, new_version]                 written
--   [0, current_version, blob|nil]   conflict: nothing written; the current
--                                    state, so the caller can decide again
--                                    without another read (nil = no blob).
--
-- The new version is max(current + 1, server time in µs): a key that expired
-- and is created again starts far above any version a node may still hold in
-- its cache, so a stale expected_version can never match it by accident (ABA).
-- An expire_at_ms already in the past makes Redis delete K at once (the
-- record is expired); the reply is still [1, v] and the next CAS sees version 0.
-------------------------------------------------------------------------------
local function fc_cas(keys, args)
  local F = 'fc_cas_v1'
  if #keys ~= 1 then
    return redis.error_reply('ERR ' .. F .. ': expects exactly 1 key')
  end
  if #args ~= 3 then
    return redis.error_reply('ERR ' .. F .. ': expects 3 arguments: expected_version blob expire_at_ms')
  end
  local expected, err = uint_arg(args[1], F, 'expected_version')
  if not expected then return err end
  local blob = args[2]
  local expire_at
  expire_at, err = uint_arg(args[3], F, 'expire_at_ms')
  if not expire_at then return err end

  local k = keys[1]
  -- A missing key (or a missing/garbled 'v') reads as version 0.
  local cur = tonumber(redis.call('HGET', k, 'v')) or 0
  if cur ~= expected then
    -- HGET returns false for a missing field; false becomes a nil reply
    -- element (a Lua nil would end the array instead).
    return {0, cur, redis.call('HGET', k, 'b')}
  end

  local new = math.max(cur + 1, now_us())
  if new > MAX_INT then
    return redis.error_reply('ERR ' .. F .. ': version would exceed 2^53-1')
  end
  redis.call('HSET', k, 'v', istr(new), 'b', blob)
  if expire_at > 0 then
    redis.call('PEXPIREAT', k, istr(expire_at))
  else
    redis.call('PERSIST', k)
  end
  return {1, new}
end

-------------------------------------------------------------------------------
-- fc_cas_v3: fc_cas_v1, aware of hot keys.
--
--   FCALL fc_cas_v3 1 K expected_version blob expire_at_ms
--
-- Reply: as fc_cas_v1's, or [-2, since_ms, blob|nil] when fc_hot_v1 froze K
-- (since_ms: when, Redis's clock): nothing is written, whatever the version;
-- the blob is the record as frozen. Checked before the version, so a node
-- holding any copy learns the key is hot on its next write.
-------------------------------------------------------------------------------
local function fc_cas_v3(keys, args)
  if #keys == 1 then
    local since = tonumber(redis.call('HGET', keys[1], 'h'))
    if since then return {-2, since, redis.call('HGET', keys[1], 'b')} end
  end
  return fc_cas(keys, args)
end

-------------------------------------------------------------------------------
-- fc_hot_v1: freezes a hot key's record, or extends a frozen one's life.
--
--   FCALL fc_hot_v1 1 K until_ms freeze
--
-- freeze "1": K is frozen now if it is not yet (field h = Redis's time in ms;
-- the version moves, so every cached copy is behind), whatever its version:
-- the record as it is then is what every node seeds its leases from, holds
-- open in it included. freeze "0" never freezes: a node extending a freeze
-- it uses learns whether it still stands. Either way a frozen K lives until
-- until_ms at least (never shortened; a K without expiry keeps none): a
-- node asks for the end of the periods it leases, so a freeze ends between
-- periods, never inside one the fleet leased.
--
-- Reply: [since_ms, expire_at_ms, blob|nil] when K is frozen (expire_at_ms
-- 0: no expiry); [0, version] when it is not (freeze "0").
-------------------------------------------------------------------------------
local function fc_hot(keys, args)
  local F = 'fc_hot_v1'
  if #keys ~= 1 then
    return redis.error_reply('ERR ' .. F .. ': expects exactly 1 key')
  end
  if #args ~= 2 then
    return redis.error_reply('ERR ' .. F .. ': expects 2 arguments: until_ms freeze')
  end
  local until_ms, err = uint_arg(args[1], F, 'until_ms')
  if not until_ms then return err end
  local freeze
  freeze, err = uint_arg(args[2], F, 'freeze')
  if not freeze then return err end
  local k = keys[1]
  local since = tonumber(redis.call('HGET', k, 'h'))
  if not since then
    local cur = tonumber(redis.call('HGET', k, 'v')) or 0
    if freeze ~= 1 then return {0, cur} end
    since = now_ms()
    redis.call('HSET', k, 'h', istr(since), 'v', istr(math.max(cur + 1, now_us())))
  end
  local ttl = redis.call('PTTL', k)
  local expire_at = 0
  if ttl >= 0 then
    expire_at = math.max(now_ms() + ttl, until_ms)
    redis.call('PEXPIREAT', k, istr(expire_at))
  end
  return {since, expire_at, redis.call('HGET', k, 'b')}
end

-- The max-min fair share of `pool` for a demand `mine`, among `demands`
-- (mine included), by water-filling in real arithmetic (independent of the
-- order of equal demands): the level rises until each demand is met or the
-- pool runs out; the share is min(mine, level), rounded up so the last few
-- units are not stranded between holders whose exact shares are fractions
-- (callers cap it by what is free). 1e-9 absorbs rounding so an exact
-- integer share is not rounded up.
local function fair_share(demands, pool, mine)
  table.sort(demands)
  local remaining, left, level = pool, #demands, nil
  for _, d in ipairs(demands) do
    local fair = remaining / left
    if d >= fair then
      level = fair
      break
    end
    remaining = remaining - d
    left = left - 1
  end
  if level ~= nil and level < mine then
    return math.ceil(level - 1e-9)
  end
  return mine
end

-- Parses args[first], args[first + 1], ... as the named non-negative
-- integers: a table by name, or nil and the error reply of the first bad one.
local function uint_args(args, first, names, fname)
  local v = {}
  for i, aname in ipairs(names) do
    local n, err = uint_arg(args[first + i - 1], fname, aname)
    if not n then return nil, err end
    v[aname] = n
  end
  return v
end

-- The arguments of a holder's call (fc_lease_v1, fc_lease_v2, fc_line_v1):
-- one key, the holder's name, then the unsigned integers `names`. Returns
-- node, v; or nil, an error reply naming what is wrong.
local function holder_args(F, keys, args, names)
  if #keys ~= 1 then
    return nil, redis.error_reply('ERR ' .. F .. ': expects exactly 1 key')
  end
  if #args ~= #names + 1 then
    return nil, redis.error_reply('ERR ' .. F .. ': expects ' .. (#names + 1) ..
      ' arguments: node ' .. table.concat(names, ' '))
  end
  if args[1] == '' then
    return nil, redis.error_reply('ERR ' .. F .. ': node must not be empty')
  end
  local v, err = uint_args(args, 2, names, F)
  if not v then return nil, err end
  return args[1], v
end

-------------------------------------------------------------------------------
-- Lease hash layout (one hash per leased quantity), per node name N:
--   s:N  cumulative units N has spent (absolute; only ever raised)
--   g:N  cumulative units granted to N (absolute); N's headroom = g - s
--        (less r:N, below)
--   w:N  N's last want
--   e:N  N's grant expiry, Redis server time in ms
--   x:N  N's open holds may be committed until then (Redis time, ms)
--   u:N  set if N reports its spend later than it commits (spend_reports
--        "batched"): when its headroom is reclaimed, up to u - 1 units of
--        it are counted as spent (N may have committed that much
--        unreported; 1, from builds before the bound: all of it), and the
--        rest goes back to the pool
--   o:N  cumulative units N committed of other holders' holds (a
--        reservation made on another node, committed on N; absolute):
--        counted as spent, not taken from N's headroom (issue 47)
--   r:N  cumulative units of N's holds other holders committed (and
--        reported in their o:); N's headroom = g - s - r
--   ~S   the spent of holders folded away (fold_dead), in sum (s + o)
-- Node names may contain any bytes, ':' included: a field is split after its
-- two-byte prefix only.
-------------------------------------------------------------------------------
local function load_lease(L)
  local nodes, names, folded = {}, {}, 0
  local flat = redis.call('HGETALL', L)
  for i = 1, #flat, 2 do
    local f = flat[i]
    local p = string.sub(f, 1, 2)
    if f == '~S' then
      folded = tonumber(flat[i + 1]) or 0
    elseif p == 's:' or p == 'g:' or p == 'w:' or p == 'e:' or p == 'x:' or p == 'u:'
        or p == 'o:' or p == 'r:' then
      local name = string.sub(f, 3)
      local n = nodes[name]
      if not n then
        n = {s = 0, g = 0, w = 0, e = 0, x = 0, u = 0, o = 0, r = 0}
        nodes[name] = n
        names[#names + 1] = name
      end
      n[string.sub(f, 1, 1)] = tonumber(flat[i + 1]) or 0
    end
  end
  return nodes, names, folded
end

-- When holder n's headroom may go back to the pool: once its grant and its
-- open holds have both ended (a holder written without x: keeps an hour).
local function reclaim_at(n)
  local holds_until = n.x
  if holds_until == 0 then holds_until = n.e + 3600000 end
  return math.max(n.e, holds_until)
end

-- What a reclaim counts as spent of holder n's headroom: nothing if it
-- reported each commit (u = 0), all of it if it reported later with no bound
-- (u = 1, builds before the bound), else at most its bound u - 1.
local function unreported_taken(n)
  local headroom = math.max(0, n.g - n.s - n.r)
  if n.u == 0 then return 0 end
  if n.u == 1 then return headroom end
  return math.min(headroom, n.u - 1)
end

-- A holder reclaimed this long ago is folded away: its spent is added to ~S
-- and its fields are deleted, so a lease hash holds its live holders only,
-- not five fields for every node incarnation that ever held it (a rolling
-- restart adds one per node). A node stops using a holder name 5 minutes
-- after its last call (REHOLD_AFTER in src/engine/leases.rs) and reports
-- under a new one from then, so a name is never used after its fold: its
-- spent is never counted twice.
local FOLD_AFTER_MS = 600000

-- Folds the holders of L (as load_lease loaded them) other than `node` that
-- were reclaimed over FOLD_AFTER_MS before now. Returns the names kept and
-- ~S after the fold.
local function fold_dead(L, nodes, names, folded, node, now)
  local kept, before = {}, folded
  for _, name in ipairs(names) do
    local n = nodes[name]
    if name ~= node and reclaim_at(n) + FOLD_AFTER_MS < now then
      folded = folded + n.s + n.o
      nodes[name] = nil
      redis.call('HDEL', L, 's:' .. name, 'g:' .. name, 'w:' .. name, 'e:' .. name,
        'x:' .. name, 'u:' .. name, 'o:' .. name, 'r:' .. name)
    else
      kept[#kept + 1] = name
    end
  end
  if folded ~= before then redis.call('HSET', L, '~S', istr(folded)) end
  return kept, folded
end

-------------------------------------------------------------------------------
-- fc_lease_v1: a max-min fair lease of units out of a total.
--
--   FCALL fc_lease_v1 1 L node spent want total ttl_ms grace_ms key_expire_ms
--
--   node           the caller's name (one per node incarnation)
--   spent          S: the caller's cumulative spent units, absolute
--   want           headroom (units beyond S) the caller would like to hold
--   total          the most ever granted in sum: Σ spent + Σ headroom <= total
--   ttl_ms         the caller's grant lives this long from now (Redis clock)
--   grace_ms       the caller's open holds may be committed until now +
--                  grace_ms (its latest reservation deadline): stored as
--                  x:<node>. A holder is reclaimed (its headroom returns to
--                  the pool, its spent stays counted) once both its grant
--                  and that time have passed: a dead node's headroom comes
--                  back seconds after it died, not an hour (a holder written
--                  without x: keeps the old hour). Ten minutes after that
--                  it is folded away (fold_dead): its spent stays counted
--                  in ~S, its fields go
--   key_expire_ms  PEXPIRE of the whole hash; "0" leaves its expiry as it is
--
-- Reply: [g_node, s_node, spent_total, total, now_ms], all integers. The
-- caller's headroom is g_node - s_node; it may spend while its own S stays
-- <= g_node (and its local clock says the grant is still alive).
--
-- Every count is absolute, so a retried call or one whose reply was lost
-- changes nothing: the same S and want give the same g (while the pool does
-- not change under it).
--
-- Fairness: the pool (total - Σ spent) is water-filled over the wants of the
-- live nodes (not yet reclaimed, the caller with its new want): wants in
-- ascending order, each gets min(want, remaining / nodes left). The caller's
-- new headroom is max(current headroom, min(ceil(share), total - Σ spent -
-- others' headroom)). Grants are never revoked: a node that came first may
-- hold more than its fair share until it spends down; later calls converge.
-- The share is rounded up so the last few units are not stranded between
-- nodes whose exact shares are fractions; the cap by what is free keeps the
-- invariant.
--
-- Invariant: Σ (s + o) + Σ max(0, g - s - r) <= total, provided every call had S <= the
-- caller's g and total never decreased. A call that breaks either premise
-- (S above its grant; a smaller total) cannot restore it, since grants are
-- not revoked, but it grants nothing new while the sum is over total.
-------------------------------------------------------------------------------
-- The grant arithmetic of fc_lease_v1 and fc_lease_v2 (see fc_lease_v1):
-- reports node's spend v.spent, grants it a share of v.total; with open
-- false (v2: Redis's time is outside the lease's period) it grants no
-- headroom at all. Returns the caller's holder table and Σ spent.
local function lease_grant(L, node, v, now, open)
  local nodes, names, folded = load_lease(L)
  names, folded = fold_dead(L, nodes, names, folded, node, now)

  local me = nodes[node]
  if not me then
    me = {s = 0, g = 0, w = 0, e = 0, x = 0, u = 0, o = 0, r = 0}
    nodes[node] = me
    names[#names + 1] = node
  end
  -- Spent only rises (a replayed older report must not lower it); a grant
  -- below spent (a node spent past its grant) is lifted to spent so headroom
  -- is never negative. Others' holds committed here (o) and this holder's
  -- committed elsewhere (r) only rise too.
  me.s = math.max(me.s, v.spent)
  me.o = math.max(me.o, v.foreign or 0)
  me.r = math.max(me.r, v.given or 0)
  me.g = math.max(me.g, me.s + me.r)

  local spent, held_others = folded, 0
  local live = {} -- wants of live nodes, the caller's included
  for _, name in ipairs(names) do
    local n = nodes[name]
    spent = spent + n.s + n.o
    if name ~= node then
      if reclaim_at(n) < now then
        -- Reclaimed: unspent headroom returns to the pool, or, from a
        -- holder that reports later than it commits, is counted as spent
        -- (it may have spent it: a budget is never exceeded, and what it
        -- had not spent is not delivered). Written only when it changes, so
        -- a long-dead node costs no write per call.
        if n.g > n.s + n.r then
          local taken = unreported_taken(n)
          spent = spent + taken
          n.s = n.s + taken
          n.g = n.s + n.r
          redis.call('HSET', L, 's:' .. name, istr(n.s), 'g:' .. name, istr(n.g))
        end
      else
        held_others = held_others + math.max(0, n.g - n.s - n.r)
        live[#live + 1] = n.w
      end
    end
  end
  live[#live + 1] = v.want

  local share = fair_share(live, math.max(0, v.total - spent), v.want)
  if not open then share = 0 end

  local headroom = me.g - me.s - me.r
  local free = math.max(0, v.total - spent - held_others)
  local new_headroom = math.max(headroom, math.min(share, free))
  -- Outside the period Redis is in, nothing may be spent on it.
  if not open then new_headroom = 0 end
  me.g = me.s + me.r + new_headroom

  redis.call('HSET', L,
    's:' .. node, istr(me.s),
    'g:' .. node, istr(me.g),
    'w:' .. node, istr(v.want),
    'e:' .. node, istr(now + v.ttl_ms),
    'x:' .. node, istr(now + v.grace_ms))
  if (v.later or 0) >= 1 and me.u ~= v.later then redis.call('HSET', L, 'u:' .. node, istr(v.later)) end
  if me.o > 0 then redis.call('HSET', L, 'o:' .. node, istr(me.o)) end
  if me.r > 0 then redis.call('HSET', L, 'r:' .. node, istr(me.r)) end
  if v.key_expire_ms > 0 then
    redis.call('PEXPIRE', L, istr(v.key_expire_ms))
  end
  return me, spent
end

local function fc_lease(keys, args)
  local node, v = holder_args('fc_lease_v1', keys, args,
    {'spent', 'want', 'total', 'ttl_ms', 'grace_ms', 'key_expire_ms'})
  if not node then return v end

  local now = now_ms()
  local me, spent = lease_grant(keys[1], node, v, now, true)
  return {me.g, me.s, spent, v.total, now}
end

-------------------------------------------------------------------------------
-- fc_lease_v2: fc_lease_v1 with the period and the total computed here, at
-- Redis's time, from parameters stored in the lease hash.
--
--   FCALL fc_lease_v2 1 L node spent want ttl_ms grace_ms key_expire_ms
--                         start_ms end_ms rule amount allowance look_ms total
--                         [reports_later segments_id segments
--                          [foreign given]]
--
--   start_ms, end_ms  the lease's period [start, end), unix ms. Redis's time
--                     outside it grants no headroom (a node whose clock runs
--                     ahead or behind cannot spend a period before it starts
--                     or after it ended), and no grant outlives its end
--   rule              how the total is computed, at Redis's time now, with
--                     t = min(max(now + look_ms, start), end):
--                     0: `total` as sent
--                     1: `amount` (a window's limit, an asap budget)
--                     2: even pacing: min(amount, ceil(amount * (t - start)
--                        / (end - start)) + allowance)
--                     3: profile pacing: min(amount, ceil(amount * F(t) /
--                        F(end)) + allowance), F the weighted time of the
--                        segments (weighted_at)
--                     4: adaptive pacing: the plan (~a, ~base) fc_plan_v1
--                        stored in this hash (none: a = start, base = 0),
--                        t' = max(t, a): min(amount, base + ceil((amount -
--                        base) * (F(t') - F(a)) / (F(end) - F(a))) +
--                        allowance); amount if F(end) = F(a)
--   amount, allowance, look_ms   as the rule says; stored (~r ~n ~al ~lk
--                     ~ps ~pe) for inspection
--   reports_later     0 if the caller reports each commit before it is
--                     acknowledged; b + 1 if it reports later
--                     (spend_reports "batched"; stored as u:<node>), with
--                     at most b units committed unreported: that much of
--                     its headroom, once reclaimed, counts as spent (1 from
--                     builds before the bound: all of it)
--   segments_id, segments   rules 3 and 4: the period's weighted time,
--                     "start_ms:weight,start_ms:weight,..." from the period's
--                     start (local hours need the time-zone database, which
--                     the node has), and its digest. Stored (~pf, ~pid) when
--                     sent; a call may send "" for segments when the stored
--                     id is segments_id. Otherwise nothing is granted and
--                     need_segments is 1: call again with them.
--   foreign           the caller's cumulative units committed of other
--                     holders' holds (stored as o:<node>; counted as spent,
--                     not taken from its headroom). Reported before such a
--                     commit is acknowledged, so a holder that dies with
--                     holds another node committed cannot have them spent
--                     again once its headroom is reclaimed (issue 47)
--   given             the caller's cumulative units of its own holds that
--                     other holders committed (r:<node>): its headroom is
--                     g - s - r
--
-- Reply: [g_node, s_node, spent_total, total, now_ms, usable_ms,
-- need_segments]: usable_ms is how long the grant may be used, min(ttl_ms,
-- end - now), 0 outside the period.
-------------------------------------------------------------------------------

-- F(t) of a weighted time: the sum of weight * ms of its segments up to t
-- (`seg`: {start, weight} pairs in order; the last runs to end_ms).
local function weighted_at(seg, end_ms, t)
  local f = 0
  for i, sg in ipairs(seg) do
    if sg[1] >= t then break end
    local e = end_ms
    if seg[i + 1] then e = seg[i + 1][1] end
    f = f + sg[2] * (math.min(t, e) - sg[1])
  end
  return f
end

-- The segments of rules 3 and 4, from the call or the hash: a list of
-- {start, weight}, or nil (the hash lacks the ones named), or nil and an
-- error reply.
local function lease_segments(F, L, id, text)
  if not string.match(id, '^%d+$') then
    return nil, redis.error_reply('ERR ' .. F .. ': segments_id must be a non-negative integer')
  end
  if text == '' then
    if redis.call('HGET', L, '~pid') ~= id then return nil end
    text = redis.call('HGET', L, '~pf')
  end
  local seg = {}
  for a, b in string.gmatch(text, '(%d+):(%d+)') do
    seg[#seg + 1] = {tonumber(a), tonumber(b)}
  end
  if #seg == 0 then
    return nil, redis.error_reply('ERR ' .. F .. ': segments must be start_ms:weight,...')
  end
  return seg
end

local function fc_lease_v2(keys, args)
  local F = 'fc_lease_v2'
  local extra = {'0', '', '', '0', '0'}
  if #args == 16 or #args == 18 then
    extra = {args[14], args[15], args[16], args[17] or '0', args[18] or '0'}
    args = {unpack(args, 1, 13)}
  end
  local node, v = holder_args(F, keys, args,
    {'spent', 'want', 'ttl_ms', 'grace_ms', 'key_expire_ms', 'start_ms', 'end_ms',
     'rule', 'amount', 'allowance', 'look_ms', 'total'})
  if not node then return v end
  if v.end_ms <= v.start_ms or v.rule > 4 then
    return redis.error_reply('ERR ' .. F .. ': needs start_ms < end_ms and a rule from 0 to 4')
  end
  local later, err = uint_arg(extra[1], F, 'reports_later')
  if not later then return err end
  v.later = later
  local foreign, ferr = uint_arg(extra[4], F, 'foreign')
  if not foreign then return ferr end
  local given, gerr = uint_arg(extra[5], F, 'given')
  if not given then return gerr end
  v.foreign, v.given = foreign, given
  if v.rule >= 3 and extra[2] == '' then
    return redis.error_reply('ERR ' .. F .. ': rules 3 and 4 need segments_id and segments')
  end
  local L = keys[1]
  local now = now_ms()
  local t = math.min(math.max(now + v.look_ms, v.start_ms), v.end_ms)
  local need = 0
  if v.rule == 1 then
    v.total = v.amount
  elseif v.rule == 2 then
    local paced = math.ceil(v.amount * (t - v.start_ms) / (v.end_ms - v.start_ms))
    v.total = math.min(v.amount, paced + v.allowance)
  elseif v.rule >= 3 then
    local seg, serr = lease_segments(F, L, extra[2], extra[3])
    if serr then return serr end
    if not seg then
      need, v.total = 1, 0
    else
      if extra[3] ~= '' then redis.call('HSET', L, '~pf', extra[3], '~pid', extra[2]) end
      local a, base = v.start_ms, 0
      if v.rule == 4 then
        a = tonumber(redis.call('HGET', L, '~a')) or v.start_ms
        base = tonumber(redis.call('HGET', L, '~base')) or 0
        a = math.min(math.max(a, v.start_ms), v.end_ms)
      end
      local fa = weighted_at(seg, v.end_ms, a)
      local left = weighted_at(seg, v.end_ms, v.end_ms) - fa
      if left <= 0 then
        v.total = v.amount
      else
        local ft = weighted_at(seg, v.end_ms, math.max(t, a))
        local paced = base + math.ceil(math.max(0, v.amount - base) * (ft - fa) / left)
        v.total = math.min(v.amount, paced + v.allowance)
      end
    end
  end
  local open = now >= v.start_ms and now < v.end_ms and need == 0
  local me, spent = lease_grant(L, node, v, now, open)
  redis.call('HSET', L, '~r', istr(v.rule), '~n', istr(v.amount), '~al', istr(v.allowance),
    '~lk', istr(v.look_ms), '~ps', istr(v.start_ms), '~pe', istr(v.end_ms))
  local usable = 0
  if open then usable = math.min(v.ttl_ms, v.end_ms - now) end
  return {me.g, me.s, spent, v.total, now, usable, need}
end

-------------------------------------------------------------------------------
-- fc_line_v1: a token line (a campaign-scope rate or gap) leased in units.
--
--   FCALL fc_line_v1 1 L node spent want burst rate per_us look_us ttl_ms
--                        grace_ms key_expire_ms [reports_later [capped]]
--
--   node, spent, want, ttl_ms, grace_ms, key_expire_ms   as fc_lease_v1
--                  (spent: the caller's cumulative units on this line)
--   burst          the most units that pass at once after idling
--   rate, per_us   the line rises `rate` units every `per_us` µs
--   look_us        lookahead: a grant may take what the line allows
--                  look_us from now (0: only what it allows now)
--   reports_later  as in fc_lease_v2: once reclaimed, up to its bound of
--                  the holder's headroom stays taken from the line
--                  (default 0)
--   capped         "1": a region's line (docs/regions.md), which grants
--                  nothing beyond what the caller held until its region's
--                  caller sets a cap (fc_line_cap_v1)
--
-- The line is a token bucket over grants, at Redis time (µs):
--   allowance(t) = burst + floor((t - t0) * rate / per_us)
-- where t0 (field ~t0) moves forward only so that the allowance now is never
-- more than burst above what is granted in sum (Σ g over holders): tokens
-- left idle beyond the burst are lost, as in one node's GCRA. A new (or
-- expired) line starts full. On each call the caller's headroom goes back to
-- the line (g := s) before it is granted afresh, so every unit a holder
-- holds was granted at its last call: nothing is carried across calls.
-- Parameters are stored (~b ~r ~p ~l) for inspection; each call's apply.
--
-- Grant: max-min fair share (fair_share) of what the line allows at
-- now + look_us beyond Σ g, over the live holders' wants, never more than
-- that. Reclaim of dead holders as fc_lease_v1.
--
-- Reply: [g_node, s_node, spent_total, retry_ms, now_ms]: retry_ms is how
-- long until the line has one more unit to grant beyond what is granted now
-- (0 if it has one now).
--
-- Bound: grants in any interval of length d are at most
-- burst + rate * (d + look_us) / per_us; a holder spends a grant only within
-- its usable life U after asking, so the fleet admits in any interval of
-- length d at most burst + rate * (d + look_us + U) / per_us.
--
-- A cap set by fc_line_cap_v1 (field ~c: a region's grant from the global
-- tier, docs/regions.md) keeps Σ granted within it; a caller it holds back
-- is told to retry in 100 ms at the soonest.
-------------------------------------------------------------------------------
local function fc_line(keys, args)
  local F = 'fc_line_v1'
  local later, capped_line = 0, false
  if #args == 12 then
    if args[12] ~= '1' then
      return redis.error_reply('ERR ' .. F .. ': capped must be 1')
    end
    capped_line = true
    args = {unpack(args, 1, 11)}
  end
  if #args == 11 then
    local err
    later, err = uint_arg(args[11], F, 'reports_later')
    if not later then return err end
    args = {unpack(args, 1, 10)}
  end
  local node, v = holder_args(F, keys, args,
    {'spent', 'want', 'burst', 'rate', 'per_us', 'look_us', 'ttl_ms', 'grace_ms',
     'key_expire_ms'})
  if not node then return v end
  if v.rate < 1 or v.per_us < 1 then
    return redis.error_reply('ERR ' .. F .. ': rate and per_us must be at least 1')
  end

  local L = keys[1]
  local now_u = now_us()
  local now = math.floor(now_u / 1000)
  local nodes, names, folded = load_lease(L)
  names, folded = fold_dead(L, nodes, names, folded, node, now)
  local t0 = tonumber(redis.call('HGET', L, '~t0'))

  local me = nodes[node]
  if not me then
    me = {s = 0, g = 0, w = 0, e = 0, x = 0, u = 0}
    nodes[node] = me
    names[#names + 1] = node
  end
  me.s = math.max(me.s, v.spent)
  -- What the caller held: a cap lets it keep that much.
  local held = math.max(me.g, me.s) - me.s
  -- The caller's headroom goes back to the line; it is granted afresh below.
  me.g = me.s

  -- A folded holder's grant was its spent (reclaimed before the fold).
  local granted, spent = folded, folded
  local live = {}
  for _, name in ipairs(names) do
    local n = nodes[name]
    if name ~= node then
      if reclaim_at(n) < now then
        -- As fc_lease_v2: a holder that reports later may have committed
        -- its headroom unreported, which stays taken from the line.
        if n.g > n.s then
          n.s = n.s + unreported_taken(n)
          n.g = n.s
          redis.call('HSET', L, 's:' .. name, istr(n.s), 'g:' .. name, istr(n.g))
        end
      else
        live[#live + 1] = n.w
      end
    end
    granted = granted + math.max(n.g, n.s)
    spent = spent + n.s
  end
  live[#live + 1] = v.want

  local function allowance(t)
    return v.burst + math.floor((t - t0) * v.rate / v.per_us)
  end
  -- A new line starts full; idle tokens beyond the burst are lost.
  if t0 == nil or allowance(now_u) > granted + v.burst then
    t0 = now_u - math.ceil(granted * v.per_us / v.rate)
  end

  local avail = math.max(0, allowance(now_u + v.look_us) - granted)
  -- A region's cap (fc_line_cap_v1): Σ granted <= max(Σ now, ~c), the
  -- caller's headroom counted as it was before it went back.
  local cap = tonumber(redis.call('HGET', L, '~c'))
  if cap == nil and capped_line then cap = 0 end
  if cap ~= nil then cap = math.max(cap, granted + held) end
  local capped = cap ~= nil and cap - granted < avail
  if capped then avail = math.max(0, cap - granted) end
  local share = fair_share(live, avail, v.want)
  local new = math.min(share, avail)
  me.g = me.s + new
  granted = granted + new

  -- When the line has one unit more than is granted now.
  local need = granted + 1 - v.burst
  local at = t0 + math.ceil(need * v.per_us / v.rate) - v.look_us
  local retry_ms = 0
  if need > 0 and at > now_u then retry_ms = math.ceil((at - now_u) / 1000) end
  -- Held by the cap: the region's caller raises it once a second.
  if capped and new < v.want then retry_ms = math.max(retry_ms, 100) end

  redis.call('HSET', L,
    's:' .. node, istr(me.s),
    'g:' .. node, istr(me.g),
    'w:' .. node, istr(v.want),
    'e:' .. node, istr(now + v.ttl_ms),
    'x:' .. node, istr(now + v.grace_ms),
    '~t0', istr(t0), '~b', istr(v.burst), '~r', istr(v.rate),
    '~p', istr(v.per_us), '~l', istr(v.look_us))
  if later >= 1 and me.u ~= later then redis.call('HSET', L, 'u:' .. node, istr(later)) end
  if v.key_expire_ms > 0 then
    redis.call('PEXPIRE', L, istr(v.key_expire_ms))
  end
  return {me.g, me.s, spent, retry_ms, now}
end

-- The cap of fc_slots_cap_v1 and fc_line_cap_v1 (the same arguments: seq
-- cap key_expire_ms): set in L's ~c (its seq in ~s) unless a later one is.
-- Returns L, now_ms, the cap in force and its seq; or nil and an error.
local function set_cap(F, keys, args)
  if #keys ~= 1 then
    return nil, redis.error_reply('ERR ' .. F .. ': expects exactly 1 key')
  end
  if #args ~= 3 then
    return nil, redis.error_reply('ERR ' .. F .. ': expects 3 arguments: seq cap key_expire_ms')
  end
  local v, err = uint_args(args, 1, {'seq', 'cap', 'key_expire_ms'}, F)
  if not v then return nil, err end
  local L = keys[1]
  local now = now_ms()
  local seq = v.seq
  if seq == 0 then seq = now end
  local cur = tonumber(redis.call('HGET', L, '~s')) or -1
  if seq >= cur then
    redis.call('HSET', L, '~c', istr(v.cap), '~s', istr(seq))
    cur = seq
    -- Never shortens the life the holders' calls gave the hash (a rolling
    -- window's: its length and an hour).
    local ttl = redis.call('PTTL', L)
    if v.key_expire_ms > 0 and ttl < v.key_expire_ms then
      redis.call('PEXPIRE', L, istr(v.key_expire_ms))
    end
  end
  return L, now, tonumber(redis.call('HGET', L, '~c')) or 0, cur
end

-------------------------------------------------------------------------------
-- fc_line_cap_v1: caps what a token line grants in sum, and reads what it
-- granted (a region's caller, docs/regions.md).
--
--   FCALL fc_line_cap_v1 1 L seq cap key_expire_ms
--
--   seq            the caller's number for this cap, rising ("0": the
--                  server's time in ms); a cap older than the one set is
--                  not set
--   cap            from now on fc_line grants Σ granted <= max(Σ now, cap)
--                  (Σ over holders of the more of granted and spent, and
--                  the folded holders' spent: absolute, as the line counts)
--   key_expire_ms  PEXPIRE of the whole hash if it would live less; "0"
--                  leaves it as it is
--
-- Reply: [granted, wants, now_ms, cap, seq]: Σ granted as above, Σ of the
-- live holders' wants at their last call; the cap in force and its seq.
-------------------------------------------------------------------------------
local function fc_line_cap(keys, args)
  local L, now, cap, cur = set_cap('fc_line_cap_v1', keys, args)
  if not L then return now end
  local nodes, names, folded = load_lease(L)
  local granted, wants = folded, 0
  for _, name in ipairs(names) do
    local n = nodes[name]
    granted = granted + math.max(n.g, n.s)
    if reclaim_at(n) >= now then wants = wants + n.w end
  end
  return {granted, wants, now, cap, cur}
end

-------------------------------------------------------------------------------
-- fc_plan_v1: the adaptive pacing plan of a leased budget's period.
--
--   FCALL fc_plan_v1 1 L anchor_ms prev_anchor_ms prev_line key_expire_ms
--
--   anchor_ms       the start of the slice (local hour) the caller is in
--   prev_anchor_ms  the anchor of the plan the caller knew (0: none)
--   prev_line       that plan's line at anchor_ms (no allowance)
--   key_expire_ms   PEXPIRE of the hash if it has no expiry yet
--
-- The plan (~a anchor_ms, ~base units) is stored in the lease hash L (the
-- fc_lease_v1 hash of the budget's period). The first call in a new slice
-- makes it: base = Σ s (the fleet's reported spend), or the previous plan's
-- line at the anchor if lower and the caller knew that plan (spend ahead of
-- the line by the allowance does not add up from hour to hour), as one node
-- does (src/limits/budget.rs). Later calls, and calls from a slice already
-- passed, get the stored plan: every node paces by one plan.
--
-- Reply: [anchor_ms, base, now_ms].
-------------------------------------------------------------------------------
local function fc_plan(keys, args)
  local F = 'fc_plan_v1'
  if #keys ~= 1 then
    return redis.error_reply('ERR ' .. F .. ': expects exactly 1 key')
  end
  if #args ~= 4 then
    return redis.error_reply('ERR ' .. F ..
      ': expects 4 arguments: anchor_ms prev_anchor_ms prev_line key_expire_ms')
  end
  local v, err = uint_args(args, 1,
    {'anchor_ms', 'prev_anchor_ms', 'prev_line', 'key_expire_ms'}, F)
  if not v then return err end
  local L = keys[1]
  local a = tonumber(redis.call('HGET', L, '~a'))
  if a ~= nil and a >= v.anchor_ms then
    return {a, tonumber(redis.call('HGET', L, '~base')) or 0, now_ms()}
  end
  local nodes, names, folded = load_lease(L)
  local base = folded
  for _, name in ipairs(names) do
    base = base + nodes[name].s
  end
  if a ~= nil and a == v.prev_anchor_ms then
    base = math.min(base, v.prev_line)
  end
  redis.call('HSET', L, '~a', istr(v.anchor_ms), '~base', istr(base))
  if v.key_expire_ms > 0 and redis.call('PTTL', L) < 0 then
    redis.call('PEXPIRE', L, istr(v.key_expire_ms))
  end
  return {v.anchor_ms, base, now_ms()}
end

-------------------------------------------------------------------------------
-- Owner mode (docs/cluster.md, "Owner mode"): a user's record is decided by
-- one node, its owner, from memory; the record's field `e` is the epoch of
-- the owner that last claimed it. Epochs come from the members hash
-- (fc_member_v1) and only grow, so a deposed owner (one whose lease ran out
-- while it was paused, say) holds a lower epoch than the record and is
-- refused whatever version it read.
--
-- fc_own_v1: a new owner claims record K before deciding on it.
--
--   FCALL fc_own_v1 1 K epoch absent_ttl_ms
--
-- Reply:
--   [1, version, blob|nil]   claimed: the record as it is (nil: no blob);
--                            `e` is now `epoch` and the version moved, so
--                            no write made on an older copy can land
--   [-1, epoch_of_K]         fenced: a later owner claimed K
--
-- A record absent is created with no blob, to expire after absent_ttl_ms
-- unless a write gives it its own expiry: the claim must stand for a
-- deposed owner's write against "absent" to be refused too.
-------------------------------------------------------------------------------
local function fc_own(keys, args)
  local F = 'fc_own_v1'
  if #keys ~= 1 then
    return redis.error_reply('ERR ' .. F .. ': expects exactly 1 key')
  end
  if #args ~= 2 then
    return redis.error_reply('ERR ' .. F .. ': expects 2 arguments: epoch absent_ttl_ms')
  end
  local epoch, err = uint_arg(args[1], F, 'epoch')
  if not epoch then return err end
  local ttl
  ttl, err = uint_arg(args[2], F, 'absent_ttl_ms')
  if not ttl then return err end
  if epoch == 0 then
    return redis.error_reply('ERR ' .. F .. ': epoch must be at least 1')
  end
  local k = keys[1]
  local e = tonumber(redis.call('HGET', k, 'e')) or 0
  if e > epoch then return {-1, e} end
  local cur = tonumber(redis.call('HGET', k, 'v')) or 0
  local blob = redis.call('HGET', k, 'b')
  if e == epoch then return {1, cur, blob} end
  local new = math.max(cur + 1, now_us())
  if new > MAX_INT then
    return redis.error_reply('ERR ' .. F .. ': version would exceed 2^53-1')
  end
  redis.call('HSET', k, 'v', istr(new), 'e', istr(epoch))
  if not blob and ttl > 0 then
    redis.call('PEXPIRE', k, istr(ttl))
  end
  return {1, new, blob}
end

-------------------------------------------------------------------------------
-- fc_cas_v2: fc_cas_v1 by an owner of epoch `epoch`.
--
--   FCALL fc_cas_v2 1 K expected_version blob expire_at_ms epoch
--
-- Reply: as fc_cas_v1's, or [-1, epoch_of_K] (fenced: a later owner claimed
-- K; nothing written). A write leaves `e` at max(e, epoch).
-------------------------------------------------------------------------------
local function fc_cas_v2(keys, args)
  local F = 'fc_cas_v2'
  if #keys ~= 1 then
    return redis.error_reply('ERR ' .. F .. ': expects exactly 1 key')
  end
  if #args ~= 4 then
    return redis.error_reply('ERR ' .. F .. ': expects 4 arguments: expected_version blob expire_at_ms epoch')
  end
  local epoch, err = uint_arg(args[4], F, 'epoch')
  if not epoch then return err end
  local e = tonumber(redis.call('HGET', keys[1], 'e')) or 0
  if e > epoch then return {-1, e} end
  local r = fc_cas(keys, {args[1], args[2], args[3]})
  if type(r) == 'table' and r[1] == 1 and e < epoch
     and redis.call('EXISTS', keys[1]) == 1 then
    redis.call('HSET', keys[1], 'e', istr(epoch))
  end
  return r
end

-------------------------------------------------------------------------------
-- fc_member_v1: owner mode's membership, one hash M for the fleet.
--
--   FCALL fc_member_v1 1 M node addr epoch ttl_ms
--
-- M's fields: `#epoch`, the last epoch given out, and `n:<node>` =
-- "epoch active_from_ms expiry_ms addr" per member. epoch "0" joins: the
-- node gets the next epoch and owns nothing before active_from = now + ttl
-- (later still if an earlier process of the same name holds a lease: it
-- must run out first), so every live member, which reads M every ttl/4,
-- knows of it before it owns anything. Otherwise the call renews the lease
-- of that epoch to now + ttl; ttl_ms "0" ends it now instead (a node
-- stopping: its users move at once, not when the lease would have ended).
--
-- Reply:
--   [1, epoch, now_ms, [node, "epoch active_from expiry addr", ...]]
--   [0, now_ms]   the lease of that epoch is gone (it ran out, or another
--                 process of the same name joined): join again, deciding
--                 nothing meanwhile.
-- Members whose lease ended over a minute ago are removed.
-------------------------------------------------------------------------------
local function fc_member(keys, args)
  local F = 'fc_member_v1'
  if #keys ~= 1 then
    return redis.error_reply('ERR ' .. F .. ': expects exactly 1 key')
  end
  if #args ~= 4 then
    return redis.error_reply('ERR ' .. F .. ': expects 4 arguments: node addr epoch ttl_ms')
  end
  local node, addr = args[1], args[2]
  if #node == 0 or #node > 128 or string.find(node, ' ', 1, true) then
    return redis.error_reply('ERR ' .. F .. ': node must be 1 to 128 bytes without spaces')
  end
  if #addr == 0 or #addr > 256 or string.find(addr, ' ', 1, true) then
    return redis.error_reply('ERR ' .. F .. ': addr must be 1 to 256 bytes without spaces')
  end
  local epoch, err = uint_arg(args[3], F, 'epoch')
  if not epoch then return err end
  local ttl
  ttl, err = uint_arg(args[4], F, 'ttl_ms')
  if not ttl then return err end
  if ttl == 0 and epoch == 0 then
    return redis.error_reply('ERR ' .. F .. ': ttl_ms must be at least 1 to join')
  end
  local m = keys[1]
  local now = now_ms()
  local field = 'n:' .. node
  local cur = redis.call('HGET', m, field)
  local ce, cfrom, cexp
  if cur then
    local a, b, c = string.match(cur, '^(%d+) (%d+) (%d+) ')
    ce, cfrom, cexp = tonumber(a), tonumber(b), tonumber(c)
  end
  if epoch == 0 then
    epoch = redis.call('HINCRBY', m, '#epoch', 1)
    local from = now + ttl
    if cexp and cexp > now then from = math.max(from, cexp) end
    redis.call('HSET', m, field, istr(epoch) .. ' ' .. istr(from) .. ' ' .. istr(from + ttl) .. ' ' .. addr)
  else
    if not ce or ce ~= epoch or cexp <= now then
      return {0, now}
    end
    local exp = math.max(cexp, now + ttl)
    if ttl == 0 then exp = now end
    redis.call('HSET', m, field, istr(epoch) .. ' ' .. istr(cfrom) .. ' ' ..
      istr(exp) .. ' ' .. addr)
  end
  local all = redis.call('HGETALL', m)
  local out = {}
  for i = 1, #all, 2 do
    local f, v = all[i], all[i + 1]
    if string.sub(f, 1, 2) == 'n:' then
      local exp = tonumber(string.match(v, '^%d+ %d+ (%d+) '))
      if exp and exp + 60000 < now then
        redis.call('HDEL', m, f)
      else
        out[#out + 1] = string.sub(f, 3)
        out[#out + 1] = v
      end
    end
  end
  return {1, epoch, now, out}
end

-------------------------------------------------------------------------------
-- fc_heat_v1: owner mode's loads (docs/cluster.md, "Owner mode"): each node's
-- count of the decisions it made as owner, and the fleet's table of the
-- heaviest users that owners are placed by (src/cluster/bounded.rs).
--
--   FCALL fc_heat_v1 1 M node total top every_ms ahead_ms [key weight]...
--
-- Stores this node's report as field 'h:<node>' of the members hash M:
-- "now_ms total key weight ...", keys as 32 lowercase hex digits. Then, if
-- the last table was made at least every_ms ago (or there is none) and some
-- report no older than every_ms counts anything, makes the next one: every
-- fresh report's weights summed per key, the `top` heaviest kept (heaviest
-- first, lower key first among equals), every other decision in `rest`, to
-- take effect ahead_ms from now ('w:next': "from_ms rest key weight ...";
-- the table it replaces becomes 'w:prev'). Reports older than 2 * every_ms
-- are removed.
--
-- Reply: [now_ms, prev|nil, next|nil]. Every node places owners by the same
-- tables; `ahead_ms` gives each time to read a new one before it applies.
-------------------------------------------------------------------------------
local function fc_heat(keys, args)
  local F = 'fc_heat_v1'
  if #keys ~= 1 then
    return redis.error_reply('ERR ' .. F .. ': expects exactly 1 key')
  end
  if #args < 5 or #args % 2 ~= 1 then
    return redis.error_reply('ERR ' .. F .. ': expects node total top every_ms ahead_ms [key weight]...')
  end
  local node = args[1]
  if #node == 0 or #node > 128 or string.find(node, ' ', 1, true) then
    return redis.error_reply('ERR ' .. F .. ': node must be 1 to 128 bytes without spaces')
  end
  local total, top, every, ahead, err
  total, err = uint_arg(args[2], F, 'total')
  if not total then return err end
  top, err = uint_arg(args[3], F, 'top')
  if not top then return err end
  if top > 4096 then
    return redis.error_reply('ERR ' .. F .. ': top must be at most 4096')
  end
  every, err = uint_arg(args[4], F, 'every_ms')
  if not every then return err end
  ahead, err = uint_arg(args[5], F, 'ahead_ms')
  if not ahead then return err end
  if (#args - 5) / 2 > top then
    return redis.error_reply('ERR ' .. F .. ': at most `top` keys')
  end
  local m = keys[1]
  local now = now_ms()
  local report = {istr(now), istr(total)}
  for i = 6, #args, 2 do
    if not string.match(args[i], '^[0-9a-f]+$') or #args[i] ~= 32 then
      return redis.error_reply('ERR ' .. F .. ': a key must be 32 lowercase hex digits')
    end
    local w
    w, err = uint_arg(args[i + 1], F, 'weight')
    if not w then return err end
    report[#report + 1] = args[i]
    report[#report + 1] = istr(w)
  end
  redis.call('HSET', m, 'h:' .. node, table.concat(report, ' '))
  local prev, next = redis.call('HGET', m, 'w:prev'), redis.call('HGET', m, 'w:next')
  local made = next and tonumber(string.match(next, '^(%d+) ')) - ahead
  if not made or made + every <= now then
    local all = redis.call('HGETALL', m)
    local sum, sums, keys_seen = 0, {}, {}
    for i = 1, #all, 2 do
      local f, v = all[i], all[i + 1]
      if string.sub(f, 1, 2) == 'h:' then
        local at, t = string.match(v, '^(%d+) (%d+)')
        at, t = tonumber(at), tonumber(t)
        if not at or at + 2 * every < now then
          redis.call('HDEL', m, f)
        elseif at + every >= now then
          sum = sum + t
          local first = true
          local key
          for word in string.gmatch(string.sub(v, #string.match(v, '^%d+ %d+') + 1), '%S+') do
            if first then
              key = word
            else
              if not sums[key] then
                sums[key] = 0
                keys_seen[#keys_seen + 1] = key
              end
              sums[key] = sums[key] + tonumber(word)
            end
            first = not first
          end
        end
      end
    end
    if sum > 0 then
      table.sort(keys_seen, function(a, b)
        if sums[a] ~= sums[b] then return sums[a] > sums[b] end
        return a < b
      end)
      local kept, out = 0, {}
      for i = 1, math.min(top, #keys_seen) do
        local k = keys_seen[i]
        kept = kept + sums[k]
        out[#out + 1] = k
        out[#out + 1] = istr(sums[k])
      end
      local text = istr(now + ahead) .. ' ' .. istr(math.max(sum - kept, 0))
      if #out > 0 then text = text .. ' ' .. table.concat(out, ' ') end
      prev = next
      next = text
      if prev then redis.call('HSET', m, 'w:prev', prev) end
      redis.call('HSET', m, 'w:next', next)
    end
  end
  return {now, prev or false, next or false}
end

-------------------------------------------------------------------------------
-- fc_peek_v1 (no-writes): a cached copy's freshness check.
--
--   FCALL fc_peek_v1 1 K version
--
-- Reply: 1 when record K is at `version` (0: K is absent); else [v, blob],
-- its current version and value (0 and nil when absent). The record travels
-- only when it moved: a decision that wrote nothing on a current copy (a
-- denial) read the whole record before (HMGET v b) to learn its version.
-------------------------------------------------------------------------------
local function fc_peek(keys, args)
  local F = 'fc_peek_v1'
  if #keys ~= 1 then
    return redis.error_reply('ERR ' .. F .. ': expects exactly 1 key')
  end
  if #args ~= 1 then
    return redis.error_reply('ERR ' .. F .. ': expects 1 argument: version')
  end
  local version, err = uint_arg(args[1], F, 'version')
  if not version then return err end
  local cur = tonumber(redis.call('HGET', keys[1], 'v')) or 0
  if cur == version then return 1 end
  return {cur, redis.call('HGET', keys[1], 'b')}
end

-------------------------------------------------------------------------------
-- fc_lease_read_v1 (no-writes; FCALL_RO works, also on replicas):
--
--   FCALL_RO fc_lease_read_v1 1 L
--
-- Reply: [now_ms, [field1, value1, field2, value2, ...]]: the hash's fields
-- sorted by name (HGETALL's own order depends on the encoding), values as
-- stored (decimal strings). An absent key gives [now_ms, []].
-------------------------------------------------------------------------------
local function fc_lease_read(keys, args)
  local F = 'fc_lease_read_v1'
  if #keys ~= 1 then
    return redis.error_reply('ERR ' .. F .. ': expects exactly 1 key')
  end
  if #args ~= 0 then
    return redis.error_reply('ERR ' .. F .. ': expects no arguments')
  end
  local flat = redis.call('HGETALL', keys[1])
  local fields = {}
  for i = 1, #flat, 2 do
    fields[#fields + 1] = flat[i]
  end
  table.sort(fields)
  local values = {}
  for i = 1, #flat, 2 do
    values[flat[i]] = flat[i + 1]
  end
  local out = {}
  for _, f in ipairs(fields) do
    out[#out + 1] = f
    out[#out + 1] = values[f]
  end
  return {now_ms(), out}
end

-------------------------------------------------------------------------------
-- fc_slots_v1: slots (a campaign's max_in_flight) shared by holders.
--
--   FCALL fc_slots_v1 1 L holder seq used want max ttl_ms hold_ms key_expire_ms
--
--   holder         the caller's name (one per node incarnation)
--   seq            the caller's call number, rising: a report older than one
--                  already applied (a call applied after its caller gave up)
--                  changes nothing
--   used           slots the caller holds now (absolute: it goes down too)
--   want           slots beyond `used` it would like to be able to take
--   max            the most slots held in sum: Σ granted <= max
--   ttl_ms         the caller's grant lives this long (Redis clock)
--   hold_ms        the caller's longest open hold ends this long from now:
--                  a holder is dropped (its slots freed) once both passed
--   key_expire_ms  PEXPIRE of the whole hash; "0" leaves it as it is
--
-- Fields per holder H: u:H used, h:H granted, q:H last seq, d:H demand
-- (used + want), r:H when it is dropped.
--
-- Reply: [granted, used, now_ms]. The caller may hold up to `granted`
-- slots. Unlike fc_lease_v1 (spend only grows), a holder gives slots back by
-- reporting fewer used and asking for less: its grant is set, not raised.
-- The grant is the max-min fair share of `max` over the live holders'
-- demands, never more than what the others hold leaves, and never below
-- `used` (a holder is not told to have fewer than it holds).
--
-- A cap set by fc_slots_cap_v1 (field ~c: a region's grant from the global
-- tier, docs/regions.md) lowers `max` to it.
--
-- fc_slots_v2: the same call, and the same arguments; its reply adds
-- `target`, the grant before it is raised to `used`: the max-min fair share
-- the holder would have if it held nothing (a region lowers its nodes' cap
-- to it, so a region that holds more than its share gives slots back as
-- its nodes' holds end).
--
--   Reply: [granted, used, now_ms, target]
-------------------------------------------------------------------------------
local function fc_slots_call(F, keys, args)
  if #keys ~= 1 then
    return nil, redis.error_reply('ERR ' .. F .. ': expects exactly 1 key')
  end
  if #args ~= 8 then
    return nil, redis.error_reply('ERR ' .. F ..
      ': expects 8 arguments: holder seq used want max ttl_ms hold_ms key_expire_ms')
  end
  local holder = args[1]
  if holder == '' then
    return nil, redis.error_reply('ERR ' .. F .. ': holder must not be empty')
  end
  local v, err = uint_args(args, 2,
    {'seq', 'used', 'want', 'max', 'ttl_ms', 'hold_ms', 'key_expire_ms'}, F)
  if not v then return nil, err end
  local L = keys[1]
  local now = now_ms()
  local all, names = {}, {}
  local flat = redis.call('HGETALL', L)
  for i = 1, #flat, 2 do
    local f = flat[i]
    if f == '~c' then
      v.max = math.min(v.max, tonumber(flat[i + 1]) or 0)
    end
    local p = string.sub(f, 1, 2)
    if p == 'u:' or p == 'h:' or p == 'q:' or p == 'd:' or p == 'r:' then
      local name = string.sub(f, 3)
      local n = all[name]
      if not n then
        n = {u = 0, h = 0, q = -1, d = 0, r = 0}
        all[name] = n
        names[#names + 1] = name
      end
      n[string.sub(f, 1, 1)] = tonumber(flat[i + 1]) or 0
    end
  end
  local me = all[holder]
  if me and v.seq <= me.q then
    return {me.h, me.u, now, math.min(me.h, v.max)}
  end
  if not me then
    me = {u = 0, h = 0, q = -1, d = 0, r = 0}
  end
  me.u, me.q, me.d = v.used, v.seq, v.used + v.want
  me.r = now + math.max(v.ttl_ms, v.hold_ms)
  local others, demands = 0, {me.d}
  for _, name in ipairs(names) do
    if name ~= holder then
      local n = all[name]
      if n.r < now then
        redis.call('HDEL', L, 'u:' .. name, 'h:' .. name, 'q:' .. name, 'd:' .. name,
          'r:' .. name)
      else
        others = others + n.h
        demands[#demands + 1] = n.d
      end
    end
  end
  local share = fair_share(demands, v.max, me.d)
  local free = math.max(0, v.max - others)
  local target = math.min(share, free)
  me.h = math.max(me.u, target)
  redis.call('HSET', L,
    'u:' .. holder, istr(me.u),
    'h:' .. holder, istr(me.h),
    'q:' .. holder, istr(me.q),
    'd:' .. holder, istr(me.d),
    'r:' .. holder, istr(me.r))
  if v.key_expire_ms > 0 then
    redis.call('PEXPIRE', L, istr(v.key_expire_ms))
  end
  return {me.h, me.u, now, target}
end

local function fc_slots(keys, args)
  local r, err = fc_slots_call('fc_slots_v1', keys, args)
  if not r then return err end
  return {r[1], r[2], r[3]}
end

local function fc_slots_v2(keys, args)
  local r, err = fc_slots_call('fc_slots_v2', keys, args)
  if not r then return err end
  return r
end

-------------------------------------------------------------------------------
-- fc_slots_cap_v1: caps what a slots lease's holders may be granted in sum,
-- and reads what they hold (a region's caller, docs/regions.md).
--
--   FCALL fc_slots_cap_v1 1 L seq cap key_expire_ms
--
--   seq            the caller's number for this cap, rising ("0": the
--                  server's time in ms); a cap older than the one set is
--                  not set (a late write cannot raise a cap lowered since)
--   cap            from now on fc_slots grants Σ granted <= max(Σ now, cap)
--   key_expire_ms  PEXPIRE of the whole hash if it would live less; "0"
--                  leaves it as it is
--
-- Reply: [held, demand, hold_ms, now_ms, cap, seq]: over the live holders
-- (r: not past), Σ h (what they may hold), Σ max(d, h) (what they asked),
-- the latest r: from now; the cap in force and its seq.
-------------------------------------------------------------------------------
local function fc_slots_cap(keys, args)
  local L, now, cap, cur = set_cap('fc_slots_cap_v1', keys, args)
  if not L then return now end
  local by = {}
  local flat = redis.call('HGETALL', L)
  for i = 1, #flat, 2 do
    local f = flat[i]
    local p = string.sub(f, 1, 2)
    if p == 'h:' or p == 'd:' or p == 'r:' then
      local name = string.sub(f, 3)
      local n = by[name]
      if not n then
        n = {h = 0, d = 0, r = 0}
        by[name] = n
      end
      n[string.sub(f, 1, 1)] = tonumber(flat[i + 1]) or 0
    end
  end
  local held, demand, hold = 0, 0, 0
  for _, n in pairs(by) do
    if n.r >= now then
      held = held + n.h
      demand = demand + math.max(n.d, n.h)
      hold = math.max(hold, n.r - now)
    end
  end
  return {held, demand, hold, now, cap, cur}
end

-------------------------------------------------------------------------------
-- fc_defs_v1: a batch of definition changes, all or nothing.
--
--   FCALL fc_defs_v1 2 D W expected_version writer op...
--
-- D is the definitions hash (fields = definitions, `__v` their version,
-- `__ids` the id counter), W the definitions-writer lock (a string: the
-- holder's name); both in one slot (`fc:{defs}`, `fc:{defs}:writer`).
--   expected_version  "" (any) or the version the caller read: a batch
--                     computed from an older read is refused
--   writer            "" (no lock needed) or the caller's name: refused
--                     unless W holds exactly it (a writer that lost its lock
--                     writes nothing, whatever its own timers say)
--   op...             "S" field value (set) or "D" field (delete), repeated
--
-- Reply:
--   [1, new_version]          applied: every op, and __v + 1
--   [0, current_version]      conflict: nothing applied
--   [2, holder|nil]           not the writer: nothing applied
--
-- Every argument is checked before the first write: Redis does not undo a
-- function's writes made before an error, so a bad op anywhere in the batch
-- must stop it before any HSET (all or nothing).
-------------------------------------------------------------------------------
local function fc_defs(keys, args)
  local F = 'fc_defs_v1'
  if #keys ~= 2 then
    return redis.error_reply('ERR ' .. F .. ': expects 2 keys: definitions writer')
  end
  if #args < 2 then
    return redis.error_reply('ERR ' .. F .. ': expects expected_version writer op...')
  end
  local expected = nil
  if args[1] ~= '' then
    local err
    expected, err = uint_arg(args[1], F, 'expected_version')
    if not expected then return err end
  end
  local writer = args[2]
  local ops = {}
  local i = 3
  while i <= #args do
    local op, field = args[i], args[i + 1]
    if field == nil or field == '' or string.sub(field, 1, 2) == '__' then
      return redis.error_reply('ERR ' .. F .. ': op ' .. (#ops + 1) ..
        ': a field must be given and must not start with __')
    end
    if op == 'S' then
      local value = args[i + 2]
      if value == nil then
        return redis.error_reply('ERR ' .. F .. ': op ' .. (#ops + 1) .. ': S needs a value')
      end
      ops[#ops + 1] = {'S', field, value}
      i = i + 3
    elseif op == 'D' then
      ops[#ops + 1] = {'D', field}
      i = i + 2
    else
      return redis.error_reply('ERR ' .. F .. ': op ' .. (#ops + 1) .. ': must be S or D')
    end
  end
  local D, W = keys[1], keys[2]
  if writer ~= '' then
    local holder = redis.call('GET', W)
    if holder ~= writer then
      return {2, holder}
    end
  end
  local cur = tonumber(redis.call('HGET', D, '__v')) or 0
  if expected ~= nil and cur ~= expected then
    return {0, cur}
  end
  for _, o in ipairs(ops) do
    if o[1] == 'S' then
      redis.call('HSET', D, o[2], o[3])
    else
      redis.call('HDEL', D, o[2])
    end
  end
  return {1, redis.call('HINCRBY', D, '__v', 1)}
end

-------------------------------------------------------------------------------
-- fc_writer_v1: the definitions-writer lock (one node at a time writes its
-- definitions directory; docs/cluster.md, "Definitions as files").
--
--   FCALL fc_writer_v1 1 W node ttl_ms
--
-- Takes W for `node` if no one holds it, renews it if `node` holds it (both
-- for ttl_ms); ttl_ms "0" gives it up if `node` holds it. Reply: the
-- holder after the call, or nil.
-------------------------------------------------------------------------------
local function fc_writer(keys, args)
  local F = 'fc_writer_v1'
  if #keys ~= 1 then
    return redis.error_reply('ERR ' .. F .. ': expects exactly 1 key')
  end
  if #args ~= 2 then
    return redis.error_reply('ERR ' .. F .. ': expects 2 arguments: node ttl_ms')
  end
  local node = args[1]
  if node == '' then
    return redis.error_reply('ERR ' .. F .. ': node must not be empty')
  end
  local ttl, err = uint_arg(args[2], F, 'ttl_ms')
  if not ttl then return err end
  local W = keys[1]
  local holder = redis.call('GET', W)
  if ttl == 0 then
    if holder == node then
      redis.call('DEL', W)
      return false
    end
    return holder
  end
  if holder == node then
    redis.call('PEXPIRE', W, istr(ttl))
    return node
  end
  if not holder then
    redis.call('SET', W, node, 'PX', istr(ttl))
    return node
  end
  return holder
end

redis.register_function{function_name = 'fc_cas_v1', callback = fc_cas, flags = {}}
redis.register_function{function_name = 'fc_cas_v2', callback = fc_cas_v2, flags = {}}
redis.register_function{function_name = 'fc_cas_v3', callback = fc_cas_v3, flags = {}}
redis.register_function{function_name = 'fc_hot_v1', callback = fc_hot, flags = {}}
redis.register_function{function_name = 'fc_own_v1', callback = fc_own, flags = {}}
redis.register_function{function_name = 'fc_member_v1', callback = fc_member, flags = {}}
redis.register_function{function_name = 'fc_heat_v1', callback = fc_heat, flags = {}}
redis.register_function{function_name = 'fc_peek_v1', callback = fc_peek,
  flags = {'no-writes'}}
redis.register_function{function_name = 'fc_lease_v1', callback = fc_lease, flags = {}}
redis.register_function{function_name = 'fc_lease_v2', callback = fc_lease_v2, flags = {}}
redis.register_function{function_name = 'fc_line_v1', callback = fc_line, flags = {}}
redis.register_function{function_name = 'fc_line_cap_v1', callback = fc_line_cap, flags = {}}
redis.register_function{function_name = 'fc_plan_v1', callback = fc_plan, flags = {}}
redis.register_function{function_name = 'fc_slots_v1', callback = fc_slots, flags = {}}
redis.register_function{function_name = 'fc_slots_v2', callback = fc_slots_v2, flags = {}}
redis.register_function{function_name = 'fc_slots_cap_v1', callback = fc_slots_cap, flags = {}}
redis.register_function{function_name = 'fc_lease_read_v1', callback = fc_lease_read,
                        flags = {'no-writes'}}
redis.register_function{function_name = 'fc_defs_v1', callback = fc_defs, flags = {}}
redis.register_function{function_name = 'fc_writer_v1', callback = fc_writer, flags = {}}

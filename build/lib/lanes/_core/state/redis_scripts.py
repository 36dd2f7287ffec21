"""The Lua scripts the Redis store runs: each is one atomic step across every host sharing the
server.

Keys and arguments are listed above each script. Amounts in the paid ledger are integer
pico-dollars.
"""

from __future__ import annotations

import math

PICO = 10**12  # the paid ledger counts integer pico-dollars


def pico(usd: float) -> int:
    """USD as integer pico-dollars, rounded up: a reservation is never smaller than its amount."""
    return math.ceil(round(usd * PICO, 3))


# An "approve once" is consumed by exactly one request across every host: a request of its client
# for the very request approved (fingerprint) on its model, whose worst case is at most the approved
# one (a once without its cost, kept by an older version, never matches). Expired ones are dropped.
# KEYS: the once hash. ARGV: client, candidate, fingerprint, worst case (USD), approval id (or ""),
# now. Returns the consumed id (the named one first), or false.
TAKE_ONCE = """
local named, other = false, false
local entries = redis.call('HGETALL', KEYS[1])
for i = 1, #entries, 2 do
  local ok, once = pcall(cjson.decode, entries[i + 1])
  local expiry = ok and type(once) == 'table' and tonumber(once['until'])
  if not expiry or expiry <= tonumber(ARGV[6]) then
    redis.call('HDEL', KEYS[1], entries[i])
  else
    local cost = tonumber(once['cost_usd'])
    if once['client'] == ARGV[1] and once['candidate'] == ARGV[2]
        and once['fingerprint'] == ARGV[3] and cost and cost + 1e-12 >= tonumber(ARGV[4]) then
      if entries[i] == ARGV[5] then named = entries[i] elseif not other then other = entries[i] end
    end
  end
end
local taken = named or other
if taken then redis.call('HDEL', KEYS[1], taken) end
return taken
"""

# KEYS: backoff key, deadline index.
# ARGV: scope, until (s), until (ms), value, channel, message, now.
BACKOFF = """
local current = redis.call('GET', KEYS[1])
if current then
  local ok, old = pcall(cjson.decode, current)
  if ok and tonumber(old['u']) >= tonumber(ARGV[2]) then return 0 end
end
redis.call('SET', KEYS[1], ARGV[4], 'PXAT', ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[7])
redis.call('PUBLISH', ARGV[5], ARGV[6])
return 1
"""

# The ledger of a UTC day: a hash (reservation → amount) and its running total, both in integer
# pico-dollars (amounts rounded up), so that a check is O(1) and exact however long the day.
# A client with a ceiling of its own also has a ledger and total of its own, checked in the same
# step: the client's ceiling holds inside the global one, across every host. A host that gives
# its wall (every reservation the ledger makes) has the day decided by the server's clock (TIME):
# one that asks for another day is told the server's ({-2, …}); one whose wall is further than
# the tolerance from it is refused ({-1, …}). Without a wall (restoring, tests) the day given is
# used. The ceiling is the lower of the host's and the store's terms' (KEYS[5], set by the beats).
# The ledger's keys carry no expiry, so no `volatile-*` eviction policy can drop them (lanes
# deletes the days before yesterday itself: `RedisPaid._prune`).
# A lost day is noticed here, whatever lost it: the epoch is not the one the host knows (a
# restart, a flush, or another host noticed first), or the day's total is missing while the day
# had reservations (its marker in the days hash, or its ledger). Then the totals are rebuilt from
# what the ledgers still hold, the epoch is rotated so every host puts its own reservations back
# (`put_back.py`), and the host is told ({-3, …}): paid stays closed until they all have.
# KEYS: ledger, total, client ledger, client total, the store's ceiling, epoch, days marked.
# ARGV: reservation id, amount, ceiling, client ceiling (-1: none), day, the host's wall (s; ""
# for none), tolerance (s), the epoch the host knows ("": unchecked), a new epoch.
# Returns {granted (1, 0, -1, -2 or -3), total, client total, the server's time (text)}.
RESERVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local clock = string.format('%.17g', now)
if ARGV[6] ~= '' then
  if math.abs(now - tonumber(ARGV[6])) > tonumber(ARGV[7]) then return {-1, 0, 0, clock} end
  if math.floor(now / 86400) ~= tonumber(ARGV[5]) then return {-2, 0, 0, clock} end
end
if ARGV[8] ~= '' and redis.call('GET', KEYS[6]) ~= ARGV[8] then return {-3, 0, 0, clock} end
for i = 1, 3, 2 do
  if redis.call('EXISTS', KEYS[i + 1]) == 0 and (redis.call('EXISTS', KEYS[i]) == 1
      or (i == 1 and redis.call('HEXISTS', KEYS[7], ARGV[5]) == 1)) then
    local sum = 0
    for _, v in ipairs(redis.call('HVALS', KEYS[i])) do sum = sum + tonumber(v) end
    redis.call('SET', KEYS[i + 1], string.format('%.0f', sum))
    if i == 1 then
      redis.call('SET', KEYS[6], ARGV[9])
      return {-3, 0, 0, clock}
    end
  end
end
local ceiling = tonumber(ARGV[3])
local shared = tonumber(redis.call('GET', KEYS[5]) or '')
if shared and shared < ceiling then ceiling = shared end
local total = tonumber(redis.call('GET', KEYS[2]) or '0')
local mine = tonumber(redis.call('GET', KEYS[4]) or '0')
if total + tonumber(ARGV[2]) > ceiling + 1 then return {0, total, mine, clock} end
local own = tonumber(ARGV[4])
if own >= 0 and mine + tonumber(ARGV[2]) > own + 1 then return {0, total, mine, clock} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
total = redis.call('INCRBY', KEYS[2], ARGV[2])
redis.call('HSET', KEYS[7], ARGV[5], 1)
if own >= 0 then
  redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
  mine = redis.call('INCRBY', KEYS[4], ARGV[2])
end
return {1, total, mine, clock}
"""

# KEYS: ledger, total, client ledger, client total. ARGV: reservation id, real cost. An unknown
# id is left alone; the client's ledger follows when the reservation is in it. A total that is
# missing is left missing — never recreated from one settlement's difference: the next
# reservation finds the day lost and rebuilds it from the ledger (`RESERVE`).
SETTLE = """
for i = 1, 3, 2 do
  local old = redis.call('HGET', KEYS[i], ARGV[1])
  if old then
    redis.call('HSET', KEYS[i], ARGV[1], ARGV[2])
    if redis.call('EXISTS', KEYS[i + 1]) == 1 then
      redis.call('INCRBY', KEYS[i + 1], tonumber(ARGV[2]) - tonumber(old))
    end
  end
end
return 1
"""

# KEYS: ledger, total, client ledger, client total. ARGV: reservation id, amount, 1 when the
# reservation is in a client's ledger too. Put back a reservation Redis forgot (no expiry, as
# `RESERVE`). A missing total is first rebuilt from what its ledger still holds, so the
# reservations that survived are counted too.
RESTORE = """
for i = 1, (ARGV[3] == '1' and 3 or 1), 2 do
  if redis.call('EXISTS', KEYS[i + 1]) == 0 then
    local sum = 0
    for _, v in ipairs(redis.call('HVALS', KEYS[i])) do sum = sum + tonumber(v) end
    redis.call('SET', KEYS[i + 1], string.format('%.0f', sum))
  end
  if redis.call('HSETNX', KEYS[i], ARGV[1], ARGV[2]) == 1 then
    redis.call('INCRBY', KEYS[i + 1], ARGV[2])
  end
end
return 1
"""

# KEYS: a hash. ARGV: expire at (0: never), then field/value pairs; each field keeps the larger
# number.
MAX = """
for i = 2, #ARGV, 2 do
  local current = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0')
  if tonumber(ARGV[i + 1]) > current then redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
end
if ARGV[1] ~= '0' then redis.call('EXPIREAT', KEYS[1], ARGV[1]) end
return 1
"""

# KEYS: the probe lease, the scope's backoff. ARGV: this lease's token, ttl (ms), the host's token
# prefix. {1}: leased; {0}: another host probes; {2, backoff}: the door is already known closed (a
# backoff published a moment ago). A host never waits on its own lease: one it holds (its release
# not yet flushed) is taken over by its next probe, under a new token.
LEASE = """
local b = redis.call('GET', KEYS[2])
if b then return {2, b} end
local held = redis.call('GET', KEYS[1])
if (not held) or string.sub(held, 1, string.len(ARGV[3])) == ARGV[3] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {1, ''}
end
return {0, ''}
"""

# KEYS: the probe lease. ARGV: the lease's token, channel, message. Released only under the token
# it was taken with (not a later lease of the same host).
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
"""

# A pending approval, shared by every host. KEYS: the approval hash. ARGV: id, the approval as
# JSON (no decision), drop what expired before this (s). One already decided is left alone; the
# later expiry wins.
PUT_APPROVAL = """
local new = cjson.decode(ARGV[2])
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if raw then
  local ok, old = pcall(cjson.decode, raw)
  if ok then
    if old['decision'] then return 0 end
    if tonumber(old['expires']) > tonumber(new['expires']) then new['expires'] = old['expires'] end
  end
end
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(new))
local entries = redis.call('HGETALL', KEYS[1])
for i = 1, #entries, 2 do
  local ok, one = pcall(cjson.decode, entries[i + 1])
  if (not ok) or tonumber(one['expires']) < tonumber(ARGV[3]) then
    redis.call('HDEL', KEYS[1], entries[i])
  end
end
return 1
"""

# Decide a pending approval once, across every host; a "once" keeps its once (the approval's
# request, model and worst case) in the same step, so a host that sees the decision finds it.
# KEYS: the approval hash, the once hash. ARGV: id, decision, now (s), the once's expiry (s, or "").
# Returns the approval as decided (JSON), or false when it is unknown, expired or decided. Numbers
# are kept as text: Lua's cjson would round them to 14 digits.
DECIDE_APPROVAL = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return false end
local ok, one = pcall(cjson.decode, raw)
if (not ok) or one['decision'] or tonumber(one['expires']) <= tonumber(ARGV[3]) then
  return false
end
one['decision'] = ARGV[2]
local out = cjson.encode(one)
redis.call('HSET', KEYS[1], ARGV[1], out)
if ARGV[2] == 'once' and ARGV[4] ~= '' then
  local once = {id = ARGV[1], client = one['client'], fingerprint = one['fingerprint'],
                ['until'] = ARGV[4]}
  local okd, data = pcall(cjson.decode, one['data'])
  if okd and type(data) == 'table' then
    once['candidate'] = data['candidate']
    if type(data['cost']) == 'number' then
      once['cost_usd'] = string.format('%.17g', data['cost'])
    end
  end
  redis.call('HSET', KEYS[2], ARGV[1], cjson.encode(once))
end
return out
"""

# A host found its own reservations of the day missing from the ledger (a restart from an older
# snapshot, a failover that lost writes, keys deleted): the epoch moves on, so every host puts
# its own back (`put_back.py`) — unless another host moved it first. KEYS: the epoch. ARGV: the
# epoch the host read, a new one. Returns the epoch now.
ROTATE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('SET', KEYS[1], ARGV[2]) end
return redis.call('GET', KEYS[1])
"""

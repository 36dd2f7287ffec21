"""The response cache's entries in the Redis state store: one hash per entry, expiring with its
TTL, and beside them the order they were made in, their sizes and their total, each one's client
and each client's keys — every key under one hash tag (lanes refuses Redis Cluster today; the
tag keeps the keys together should it not).

Writes and clears are scripts: the stored bytes never pass `max_bytes` (the oldest go first,
`EVICT_AT_MOST` a write: a lowered cap is reached over several writes, never by one script that
holds Redis — every host's ledger — for seconds), and
a client's entries go with `clear`. An entry Redis evicts under `maxmemory` (an entry has an
expiry, so a `volatile-*` policy takes entries before the ledger's keys) is a miss; what it
counted in the total goes when its turn to be evicted comes, or when `expire` finds it past its
TTL (its client's set of keys loses it then too). Blocking: call from a worker thread.
"""

from __future__ import annotations

from typing import Any

import redis

from lanes._core.cache.store import EVICT_AT_MOST, Entry
from lanes._core.state.redis_store import connection_pool, memory_policy, memory_setting, redacted

_FIELDS = ("client", "made_at", "body", "lane", "model", "provider", "route", "cost_usd")

# One entry gone, with what is kept beside it: its client (from `owners`, else from the entry, as
# an older version kept it) loses its key even when Redis has expired the entry itself.
_DROP = """
local order, sizes, total, clients, owners = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local p = ARGV[1]
local function drop(key)
  local gone = p .. 'e:' .. key
  local owner = redis.call('HGET', owners, key) or redis.call('HGET', gone, 'client')
  if owner then redis.call('SREM', p .. 'c:' .. owner, key) end
  redis.call('DEL', gone)
  redis.call('ZREM', order, key)
  local held = redis.call('DECRBY', total, redis.call('HGET', sizes, key) or 0)
  redis.call('HDEL', sizes, key)
  redis.call('HDEL', owners, key)
  return held
end
"""

# KEYS: order, sizes, total, clients, owners; ARGV: prefix, key, client, size, made_at, ttl_ms,
# max_bytes, then the entry's fields and values
_PUT = (
    _DROP
    + """
local key, client = ARGV[2], ARGV[3]
local size, max = tonumber(ARGV[4]), tonumber(ARGV[7])
local old = redis.call('HGET', sizes, key)
if old then redis.call('DECRBY', total, old) end
local entry = p .. 'e:' .. key
redis.call('DEL', entry)
redis.call('HSET', entry, unpack(ARGV, 8))
redis.call('PEXPIRE', entry, ARGV[6])
redis.call('ZADD', order, ARGV[5], key)
redis.call('HSET', sizes, key, size)
redis.call('HSET', owners, key, client)
redis.call('SADD', p .. 'c:' .. client, key)
redis.call('SADD', clients, client)
local held = redis.call('INCRBY', total, size)
local evicted = 0
while held > max and evicted < EVICT_AT_MOST do
  local oldest = redis.call('ZRANGE', order, 0, 0)[1]
  if not oldest then break end
  held = drop(oldest)
  evicted = evicted + 1
end
return held
""".replace("EVICT_AT_MOST", str(EVICT_AT_MOST))
)

# KEYS: as _PUT's; ARGV: prefix, made at or before (s), at most this many. Those entries, gone.
_EXPIRE = (
    _DROP
    + """
local old = redis.call('ZRANGEBYSCORE', order, '-inf', ARGV[2], 'LIMIT', 0, tonumber(ARGV[3]))
for _, key in ipairs(old) do drop(key) end
return #old
"""
)

# KEYS: as _PUT's; ARGV: prefix, then the clients whose entries go
_CLEAR = """
local order, sizes, total, clients, owners = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local p, gone = ARGV[1], 0
for i = 2, #ARGV do
  local set = p .. 'c:' .. ARGV[i]
  for _, key in ipairs(redis.call('SMEMBERS', set)) do
    gone = gone + redis.call('DEL', p .. 'e:' .. key)
    redis.call('ZREM', order, key)
    redis.call('DECRBY', total, redis.call('HGET', sizes, key) or 0)
    redis.call('HDEL', sizes, key)
    redis.call('HDEL', owners, key)
  end
  redis.call('DEL', set)
  redis.call('SREM', clients, ARGV[i])
end
if tonumber(redis.call('GET', total) or 0) < 0 then redis.call('SET', total, 0) end
return gone
"""


#: How long a connection, a read or a write of the cache waits for Redis, seconds: a job waits for
#: its read, and a cache is worth less than the state store's 2 s.
TIMEOUT_S = 0.5


class RedisEntries:
    def __init__(self, url: str, *, namespace: str = "", timeout_s: float = TIMEOUT_S) -> None:
        self.where = redacted(url)
        waits = {"socket_connect_timeout": timeout_s, "socket_timeout": timeout_s}
        pool = connection_pool(url, max_connections=8, timeout=timeout_s, **waits)
        self._r = redis.Redis(connection_pool=pool)
        self._p = f"lanes:{{{namespace}}}:cache:" if namespace else "lanes:{cache}:"
        names = ("order", "sizes", "total", "clients", "owners")
        self._keys = [self._p + name for name in names]
        self._put = self._r.register_script(_PUT)
        self._expire = self._r.register_script(_EXPIRE)
        self._clear = self._r.register_script(_CLEAR)

    def get(self, key: str, now: float, ttl_s: float) -> Entry | None:
        values: list[Any] = self._r.hmget(self._p + "e:" + key, list(_FIELDS))
        if values[0] is None or values[2] is None:
            return None
        found: dict[str, Any] = {
            name: value.decode() if name != "body" else bytes(value)
            for name, value in zip(_FIELDS, values, strict=True)
            if value is not None
        }
        names = ("client", "lane", "model", "provider", "route")
        named = {name: found.get(name, "") for name in names}
        made_at = float(found.pop("made_at", 0.0))
        if made_at <= now - ttl_s:
            return None
        return Entry(
            key=key,
            made_at=made_at,
            cost_usd=float(found.pop("cost_usd", 0.0)),
            **named,
            body=found["body"],
        )

    def put(self, entries: list[Entry], max_bytes: int, ttl_s: float) -> None:
        """One script call per entry, sent together (a pipeline, not a transaction)."""
        ttl_ms = max(1, int(ttl_s * 1000))
        with self._r.pipeline(transaction=False) as pipe:
            for entry in entries:
                pairs: list[Any] = []
                for name in _FIELDS:
                    pairs += [name, getattr(entry, name)]
                args = [self._p, entry.key, entry.client, entry.size, entry.made_at, ttl_ms]
                every: list[Any] = [*args, max_bytes, *pairs]
                self._put(keys=list(self._keys), args=every, client=pipe)
            pipe.execute()

    def expire(self, before: float, limit: int) -> int:
        return int(self._expire(keys=list(self._keys), args=[self._p, repr(before), limit]))

    def clear(self, client: str | None) -> int:
        if client is None:
            members: Any = self._r.smembers(self._keys[3])
            every = [c.decode() for c in members]
        else:
            every = [client]
        return int(self._clear(keys=list(self._keys), args=[self._p, *every]))

    def sizes(self) -> tuple[int, int]:
        count = self._r.zcard(self._keys[0])
        total = self._r.get(self._keys[2])
        return int(count), max(0, int(total or 0))

    def memory_note(self, max_bytes: int) -> str:
        """What Redis' memory limit and policy mean for entries of `max_bytes` beside the state
        store's keys (`memory_risk`). Raises what the connection raises."""
        found = memory_setting(self._r, "maxmemory")  # None: neither CONFIG nor INFO granted
        return memory_risk(self.where, memory_policy(self._r), int(found or 0), max_bytes)

    def close(self) -> None:
        self._r.close()
        self._r.connection_pool.disconnect()


def memory_risk(where: str, policy: str, maxmemory: int, max_bytes: int) -> str:
    """How the response cache (up to `max_bytes` of answers) may crowd the state store's own keys
    out of a Redis with `maxmemory` bytes (0: no limit) under `policy`; "" when it can not. The
    paid ledger's keys carry no expiry, so a `volatile-*` policy never takes them (and an
    `allkeys-*` one keeps paid closed already); but under `noeviction` a full Redis refuses
    every write, under `volatile-ttl` the keys nearest their expiry go first — the free tier's
    counts and backoffs (minutes) before answers kept for a day — and under `volatile-random`
    any of them may."""
    if maxmemory <= 0:
        return ""
    if policy == "noeviction" and max_bytes * 2 > maxmemory:
        return (
            f"response cache: redis at {where}: [cache] max_mb ({max_bytes / 1e6:g} MB) is more "
            f"than half of Redis' maxmemory ({maxmemory:,} bytes) under noeviction — with Redis' "
            "own overhead for each entry, a full cache makes Redis refuse every write, the paid "
            "ledger's too (paid stays closed while it does): lower max_mb, or raise maxmemory"
        )
    if policy in ("volatile-ttl", "volatile-random"):
        return (
            f"response cache: redis at {where}: maxmemory-policy {policy} may take the free "
            "tier's counts and backoffs before the cache's answers when Redis is full (free "
            "quotas may be overrun, 429s follow): volatile-lru, or a max_mb well under maxmemory, "
            "keeps them"
        )
    return ""

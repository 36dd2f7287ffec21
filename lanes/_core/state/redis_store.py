"""Shared state for several hosts in Redis: `state = "redis://host:port/db"`.

The same protocols as `SQLiteStore`, for sidecars on different hosts that spend the same keys and
the same paid budget; each concern's Redis half is beside its SQLite half (see `store.py`'s table):
the free tier's memory in `memory.py`, the paid ledger (one Lua script per reservation, so two
hosts can never together cross the ceiling) in `paid.py`, approvals and onces in `approvals.py`,
grants in `grants.py`, probe leases in `leases.py`, the kill switch and the quarantine in
`switches.py`, the beats and terms in `beats.py`. This module is the connection and the sync.

Backoffs, kill-switch changes, grants and probe results are published on the deployment's channel
(`lanes:events:db<N>`; with a `state_namespace`, `lanes:{<namespace>}:events`); other hosts apply
them within milliseconds. Pub/sub spans every database of a server, so the channel names the
database, and a namespace names every key and the channel: two deployments on one server never
hear each other. Reads on the hot path never touch Redis: they use the local
view that the sync keeps. Redis is reached with redis-py's synchronous client, always from trio
worker threads (see `backend.call`). When Redis is unreachable every call raises
`StoreUnavailable`: quotas and backoff carry on from the local view, paid reservations are refused
until a full sync has run again — which first pushes this host's view back if Redis came back
empty.

Audit rows and the canary's answers stay in a local SQLite file (`local_state`, `records`): they are
this host's records, not coordination.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import uuid
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis
import trio

from lanes._core.freetier.windows import window_id
from lanes._core.state.approvals import RedisApprovals
from lanes._core.state.backend import LocalView, News, guarded, text
from lanes._core.state.beats import RedisBeats
from lanes._core.state.grants import RedisGrants
from lanes._core.state.leases import RedisLeases
from lanes._core.state.paid import RedisPaid
from lanes._core.state.put_back import PutBack
from lanes._core.state.records import LocalRecords
from lanes._core.state.store import SQLiteStore, StoreUnavailable
from lanes._core.state.switches import RedisSwitches
from lanes._core.state.terms import LIVE_S

log = logging.getLogger("lanes")
CHECKED = 8  # this host's latest reservations of the day, looked for in the ledger at each sync
LOST_OWN = (
    "the day's paid ledger is missing reservations this host made (a restart from an older "
    "snapshot, a failover that lost writes, or keys deleted)"
)
AFTER_OUTAGE = (
    "it was unreachable from this host (a failover or a restart may have lost other hosts' "
    "reservations too)"
)
LOSS_HOLD_S = 2.0  # after a loss, past every live host's next sync (they sync every 0.5 s)
POLICY_EVERY_S = 60.0  # the eviction policy is read again this often (and after every outage)


def redacted(url: str) -> str:
    """`url` without its password (or query), for logs and pages."""
    parts = urlsplit(url)
    hosts = parts.netloc.rpartition("@")[2] or "localhost"
    return f"{parts.scheme}://{hosts}{parts.path}"


def connection_pool(url: str, **options: Any) -> redis.ConnectionPool:
    """The connections to `url`'s server; for `redis+sentinel://h:p,h:p/service[/db]`, to the
    master the sentinels name, asked again after a failover (a demoted master's ReadOnlyError
    is a lost connection to redis-py's Sentinel pool: the next call finds the new master)."""
    if not url.startswith("redis+sentinel://"):
        return redis.BlockingConnectionPool.from_url(url, **options)
    from redis.sentinel import Sentinel, SentinelConnectionPool

    parts = urlsplit(url)
    query = parse_qs(parts.query)
    service, _, db = parts.path.strip("/").partition("/")
    hosts = [h.rpartition(":") for h in parts.netloc.rpartition("@")[2].split(",")]
    timeouts = {k: options[k] for k in ("socket_timeout", "socket_connect_timeout")}
    sentinel_password = query.get("sentinel_password", [None])[0]
    sentinel = Sentinel(  # type: ignore[no-untyped-call,unused-ignore]
        [(host, int(port or 26379)) for host, _, port in hosts],
        sentinel_kwargs={**timeouts, "password": sentinel_password},
        **timeouts,
    )
    options.pop("timeout", None)  # a blocking pool's wait; this pool never runs out (see threads)
    return SentinelConnectionPool(  # type: ignore[no-untyped-call,unused-ignore]
        service,
        sentinel,
        db=int(db or 0),
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
        **options,
    )


class RedisStore(RedisPaid, RedisApprovals, RedisGrants, RedisLeases, RedisSwitches, RedisBeats):
    kind = "redis"
    shared = True
    _local: SQLiteStore  # this host's file: its audit, canary answers and quarantine
    lost_reason = ""  # Redis restarted empty, or is met empty for the first time

    def __init__(
        self,
        url: str,
        *,
        local: SQLiteStore,
        namespace: str = "",
        min_replicas: int = 0,
        loss_hold_s: float = LOSS_HOLD_S,
        threads: int = 8,
        connect_timeout_s: float = 0.5,
        timeout_s: float = 2.0,
    ) -> None:
        self.where = redacted(url)
        self._local = local
        self.up = False  # until the first full sync: no paid reservation before the ledger is known
        self._host = uuid.uuid4().hex[:12]  # this process, in leases and published messages
        self.limiter = trio.CapacityLimiter(threads)
        self.listen_limiter = trio.CapacityLimiter(1)
        # a blocking pool: a call beyond the connections waits for one rather than failing as
        # "Redis down"
        pool = connection_pool(
            url,
            max_connections=threads + 4,
            timeout=timeout_s,
            socket_connect_timeout=connect_timeout_s,
            socket_timeout=timeout_s,
            decode_responses=True,
        )
        self._redis = redis.Redis(connection_pool=pool)
        self._min_replicas = min_replicas
        self._loss_hold_s = loss_hold_s  # after a loss: every live host's next sync comes first
        # a namespace is a hash tag too: every key of a deployment in one Cluster slot
        self._p = f"lanes:{{{namespace}}}:" if namespace else "lanes:"
        database = pool.connection_kwargs.get("db", 0)
        self._channel = f"{self._p}events:db{database}"  # the database too: one namespace on two
        self._scripts = {}
        self._lock = threading.Lock()
        self._epoch = None
        self._reseed_due = False
        self._put_back = PutBack(own=self._host)
        self._peers = frozenset()
        self._policy_read_at = -POLICY_EVERY_S  # monotonic
        self._policy = ""  # the server's maxmemory-policy, as last read ("": unknown)
        self._pruned_day = 0  # the server's day whose older ledgers were deleted
        self._pubsub: Any = None
        # local caches, answered without a round trip
        self._spent_cache = {}
        self._client_spent = {}
        self._grants = {}
        self._quarantine = {}
        # this host's writes waiting for the next sync, and what it must push back after a data loss
        self._settles = {}
        self._grant_writes = {}
        self._switch_writes = {}
        self._quarantine_writes = {}
        self._releases = []
        self._own = {}  # filled from this host's file at the first sync (its own, of a restart)
        self._kept = local.records
        self._own_read = False
        self._leases = {}
        self._operator = None

    @property
    def records(self) -> LocalRecords:
        """This host's audit and canary answers: its local SQLite file's."""
        return self._local.records

    def peek(self, now: float) -> News | None:
        return None  # other hosts' backoffs and switches are published (see `listen`)

    # -- the sync ---------------------------------------------------------------------------
    @guarded
    def begin_sync(self, now: float) -> bool:
        """Refresh the cached ledger and grants; True when Redis lost our shared state (a restart
        without persistence, or a first contact with an empty Redis) and it has not been pushed back
        yet: the caller then passes its view to `reseed` (asked again until a reseed succeeds)."""
        day = window_id("day", now)
        returning = self._come_back(day)
        with self._lock:  # this host's latest of today: still in the ledger, or it lost them
            mine = [r for r, (d, _) in self._own.items() if d == day][-CHECKED:]
        pipe = self._redis.pipeline(transaction=False)
        pipe.time()
        pipe.get(self._k("epoch"))
        for near in (day - 1, day, day + 1):  # the server's day may be either side of ours
            pipe.get(self._k("paid-total", near))
        pipe.hgetall(self._k("grant"))
        pipe.exists(self._k("restored", self._epoch or ""))
        if mine:
            pipe.hmget(self._k("paid", day), *mine)
        replies = pipe.execute()
        (seconds, micros), epoch, *totals = replies[:5]
        stored_grants, restoring = replies[5], replies[6]
        missing = bool(mine) and any(v is None for v in replies[7])
        epoch = self._notice_loss(
            epoch,
            missing=missing,
            returning=returning,
            holding=bool(mine),
            server_time=seconds + micros / 1e6,
        )
        if self._put_back.waiting or restoring:
            self._put_own_back(epoch)
            self._say_closed()  # still waiting for other hosts: said once
        with self._lock:
            self._take_totals(day, totals)
            self._take_grants(stored_grants)
        server_day = window_id("day", seconds + micros / 1e6)
        if server_day != self._pruned_day:
            self._prune(server_day)
            self._pruned_day = server_day
        return self._reseed_due

    def _come_back(self, day: int) -> bool:
        """What a host does before its first sync and after an outage: read its own reservations
        of a restart from its file; when it was down, refuse a Cluster, put its own back
        (upward), and read the eviction policy again. True when it is back after an outage."""
        if not self._own_read:  # what this host reserved before a restart, from its file
            with self._lock:
                self._own = {**self._kept.reservations(day - 1), **self._own}
            self._own_read = True
        returning = not self.up and self._epoch is not None
        if not self.up:
            self._refuse_cluster()
            if self._own:  # after an outage (a failover may have lost writes): ours, back, upward
                pipe = self._redis.pipeline(transaction=False)
                with self._lock:
                    self._reseed_paid(pipe)
                pipe.execute()
        since = time.monotonic() - self._policy_read_at  # wall-clock: a real interval
        if not self.up or since >= POLICY_EVERY_S:
            self._read_policy()
        return returning

    def _notice_loss(
        self,
        epoch: str | None,
        *,
        missing: bool,
        returning: bool,
        holding: bool,
        server_time: float,
    ) -> str:
        """The epoch as this sync leaves it, and a loss noticed (paid then waits for the hosts to
        put theirs back): the epoch gone or moved by another host, this host's own reservations
        missing from the day's ledger, or this host back from an outage (others may have lost
        writes it can not see) — the last two move the epoch on themselves."""
        lost = ""
        if epoch is None or (self._epoch is not None and epoch != self._epoch):
            lost = _loss(epoch, self._epoch)
        elif missing:  # the epoch and the day's total survived a loss: it moves on now
            lost, epoch = LOST_OWN, self._rotate(epoch)
        elif returning:  # other hosts may have lost writes this host can not see: they look
            lost, epoch = AFTER_OUTAGE, self._rotate(epoch)
        if lost:
            self.lost_reason = lost
            # a loss a running host notices: paid waits out the other hosts' next sync too (one
            # that joined since this host's last beat puts its own back then); met empty while
            # holding reservations of its own: the others restarted too (new, unknown ids)
            hold_s = self._loss_hold_s if self._epoch is not None else 0.0
            hold_s = LIVE_S if epoch is None and self._epoch is None and holding else hold_s
            noticed = time.monotonic()  # wall-clock: hosts put back in real time
            self._lost_day(lost, noticed, server_time, self._live_hosts(), hold_s)
        if epoch is None:
            self._redis.set(self._k("epoch"), uuid.uuid4().hex, nx=True)
            epoch = self._redis.get(self._k("epoch"))
        self._epoch = epoch
        return str(epoch)

    @guarded
    def describe(self) -> dict[str, Any]:
        """What an operator needs to know of the server (`lanes check-config --connect`): its
        version, role, eviction policy, replicas, persistence, and whether paid can open (and why
        not). Sections INFO may not give (a user without it) read as unknown."""
        info: dict[str, Any] = {}
        for section in ("server", "replication", "persistence", "cluster"):
            with contextlib.suppress(redis.ResponseError):
                info.update(self._redis.info(section))
        self._redis.ping()  # reachable (and allowed to talk) at all
        self._read_policy()
        replicas = int(info.get("connected_slaves", 0))
        why = self._evicting
        if not why and int(info.get("cluster_enabled", 0)):
            why = (
                f"redis at {self.where} is a node of a Redis Cluster, which lanes does not support"
            )
        if not why and replicas < self._min_replicas:
            why = (
                f"{replicas} replica(s) connected; state_redis_min_replicas asks for "
                f"{self._min_replicas}: every paid reservation would wait for them and be refused"
            )
        return {
            "where": self.where,
            "version": str(info.get("redis_version", "unknown")),
            "role": str(info.get("role", "unknown")),
            "maxmemory_policy": self._policy or "unknown",
            "replicas": replicas,
            "appendonly": bool(int(info.get("aof_enabled", 0))),
            "paid_can_open": not why,
            "why_not": why,
        }

    def _refuse_cluster(self) -> None:
        """A node of a Redis Cluster is refused, said plainly (its replies would be MOVED errors
        about single keys): a deployment's scripts touch several keys and its events need one
        server. A user that may not run INFO is not asked."""
        try:
            enabled = int(self._redis.info("cluster").get("cluster_enabled", 0))
        except redis.ResponseError:
            return
        if enabled:
            raise StoreUnavailable(
                f"redis at {self.where} is a node of a Redis Cluster, which lanes does not support "
                "(a deployment's scripts touch several keys, its events need one server): point "
                "`state` at one Redis, or a primary with replicas"
            )

    def _read_policy(self) -> None:
        """Read the server's `maxmemory-policy` (by CONFIG GET, else INFO where CONFIG is renamed
        or not granted). Under an `allkeys-*` policy Redis may evict the paid ledger's keys and
        forget the day's spend — they carry no expiry, so a `volatile-*` policy never does — and
        paid stays closed (`_evicting`), said in one line when that changes."""
        policy = memory_policy(self._redis)
        self._policy_read_at, self._policy = time.monotonic(), policy  # wall-clock: as above
        was, self._evicting = self._evicting, _eviction_risk(self.where, policy)
        if self._evicting and self._evicting != was:
            log.warning("%s", self._evicting)
        elif was and not self._evicting:
            log.warning(
                "state store: redis at %s: maxmemory-policy is %s; paid fallback may open",
                self.where,
                policy,
            )

    @guarded
    def reseed(self, view: LocalView, now: float) -> None:
        """Push this host's view into a Redis that forgot it: counts and spend by maximum, backoffs
        by the later deadline, our unexpired reservations, grants, kill switches, quarantines and
        what an operator set."""
        pipe = self._redis.pipeline(transaction=False)
        self._reseed_counts(pipe, view)
        pipe.execute()
        self.put_backoffs({s: b for s, b in view.backoffs.items() if b.until > now}, now)
        self.put_snapshots(view.snapshots)
        pipe = self._redis.pipeline(transaction=False)
        with self._lock:
            self._reseed_grants()
            self._reseed_switches(pipe, view, now)
            self._reseed_terms(pipe)
        pipe.execute()
        self._reseed_due = False

    @guarded
    def flush(self) -> None:
        """Write what this host queued (settlements, grants, kill switches, probe releases) and
        publish it; on failure everything stays queued. Success marks the store up: the ledger is
        whole."""
        with self._lock:
            settles, self._settles = self._settles, {}
            grants, self._grant_writes = self._grant_writes, {}
            switches, self._switch_writes = self._switch_writes, {}
            releases, self._releases = self._releases, []
        try:
            pipe = self._redis.pipeline(transaction=False)
            self._queue_settles(pipe, settles)
            self._queue_grants(pipe, grants)
            self._queue_switches(pipe, switches)
            self._queue_releases(pipe, releases)
            pipe.execute()
        except Exception:  # put the writes back, then report
            with self._lock:
                self._settles = {**settles, **self._settles}
                self._grant_writes = {**grants, **self._grant_writes}
                self._switch_writes = {**switches, **self._switch_writes}
                self._releases[:0] = releases
            raise
        if self._quarantine_writes:
            self._flush_quarantine()
        self.up = True

    # -- events ------------------------------------------------------------------------------
    @guarded
    def listen(self, timeout_s: float) -> list[dict[str, Any]]:
        """Block up to `timeout_s` (in a worker thread) for what other hosts published; grants are
        applied to the cache here, the rest is returned for the dispatcher to apply."""
        try:
            if self._pubsub is None:
                pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(self._channel)
                self._pubsub = pubsub
            events = []
            message = self._pubsub.get_message(timeout=timeout_s)
            while message is not None:
                try:
                    event = json.loads(message["data"])
                except (ValueError, TypeError):
                    event = None
                if isinstance(event, dict) and event.get("from") != self._host:
                    if event.get("t") == "grant":
                        self._heard_grant(event)
                    events.append(event)
                message = self._pubsub.get_message(timeout=0.0)
            return events
        except Exception:  # put the writes back, then report
            self._drop_pubsub()
            raise

    def _drop_pubsub(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            with contextlib.suppress(redis.RedisError, OSError):
                pubsub.close()

    def close(self) -> None:
        self._drop_pubsub()
        try:
            self._redis.close()
            # a pool we passed in is not closed with the client
            self._redis.connection_pool.disconnect()
        except (redis.RedisError, OSError):
            pass
        self._local.close()


def _loss(now: str | None, known: str | None) -> str:
    """What the epoch says was lost: `now` is the server's, `known` the one this host had."""
    if now is None and known is None:
        return "met empty at first contact"
    if now is None:
        return "it lost the paid ledger (a restart without persistence, or a flush)"
    return "another host found the day's paid ledger lost"


def memory_policy(client: redis.Redis) -> str:
    """The server's `maxmemory-policy` ("" when neither CONFIG GET nor INFO may be run)."""
    return text(memory_setting(client, "maxmemory-policy") or "")


def memory_setting(client: redis.Redis, name: str) -> Any:
    """The server's `name` (`maxmemory`, `maxmemory-policy`) by CONFIG GET, else INFO where
    CONFIG is renamed or not granted; None when neither may be run. Raises what the connection
    raises."""
    try:
        return client.config_get(name).get(name)
    except redis.ResponseError:
        try:
            return client.info("memory").get(name.replace("-", "_"))
        except redis.ResponseError:
            return None


def _eviction_risk(where: str, policy: str) -> str:
    """Why `policy` keeps paid closed ("" when it does not)."""
    if not policy:
        return (
            f"state store: redis at {where}: can not read maxmemory-policy (CONFIG GET and INFO "
            "were refused); paid fallback stays closed until lanes' user may run one of them"
        )
    if policy.startswith("allkeys-"):
        return (
            f"state store: redis at {where}: maxmemory-policy is {policy}, so Redis may evict the "
            "paid ledger when memory is full and forget the day's spend; paid fallback stays "
            "closed until it is noeviction or a volatile-* policy (CONFIG SET maxmemory-policy "
            "noeviction, and the same in redis.conf)"
        )
    return ""

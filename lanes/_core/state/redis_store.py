"""Shared state for several hosts in Redis: `state = "redis://host:port/db"`.

The same interface as `SQLiteStore`, for sidecars on different hosts that spend the same keys and
the same paid budget:

- backoffs are keys that expire on their own (`lanes:backoff:<scope>`, indexed by deadline in a
  sorted set), written by a script that keeps the *later* deadline when two hosts race;
- usage counters are hashes per window (`lanes:usage:<window>:<id>`, HINCRBY, expiring at the
  window's end — UTC minutes, days, months); credit spend is a hash of running totals;
- the latest parsed header snapshot per scope, so a host that has not called a provider yet knows;
- the paid ledger is a hash per UTC day with a running total (integer pico-dollars); reserving
  checks the total against the ceiling and writes the reservation in **one Lua script**, so two
  hosts can never together cross it;
- approvals (grants with their expiry), the runtime kill switch and the canary's quarantine;
- a probe lease per cold scope (SET NX PX), so one host probes a closed door for all of them.

Backoffs, kill-switch changes, grants and probe results are published on `lanes:events`; other
hosts apply them within milliseconds. Reads on the hot path never touch Redis: they use the local
view that the sync keeps. Redis is reached with redis-py's synchronous client, always from trio
worker threads (see `store.call`). When Redis is unreachable every call raises `StoreUnavailable`:
quotas and backoff carry on from the local view, paid reservations are refused until a full sync
has run again — which first pushes this host's view back if Redis came back empty.

Audit rows and the canary's answers stay in a local SQLite file (`local_state`): they are this
host's records, not coordination.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import threading
import uuid
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import attrs
import redis
import trio

from lanes._core.state import terms
from lanes._core.state.host import approval_from, approval_row
from lanes._core.state.redis_scripts import (
    BACKOFF,
    DECIDE_APPROVAL,
    LEASE,
    MAX,
    PICO,
    PUT_APPROVAL,
    RELEASE,
    RESERVE,
    RESTORE,
    SETTLE,
    TAKE_ONCE,
    pico,
)
from lanes._core.state.store import (
    ApprovalRecord,
    ClockRefused,
    LocalView,
    News,
    OnceConsent,
    SQLiteStore,
    StoreUnavailable,
    UsageKey,
    _snapshot_data,
    _snapshot_from,
    backoff_fields,
    backoff_from,
)
from lanes.freetier.backoff import Backoff
from lanes.freetier.headers import RateLimitSnapshot
from lanes.freetier.windows import WINDOWS, WindowName, end_of, window_id

F = TypeVar("F", bound=Callable[..., Any])
SEP = "\x1f"  # between the parts of a hash field (scopes contain "/" and ":")


def _guarded(fn: F) -> F:
    """Redis errors become `StoreUnavailable` (and mark the store down until a full sync
    succeeds)."""

    @functools.wraps(fn)
    def wrapper(self: RedisStore, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(self, *args, **kwargs)
        except (redis.RedisError, OSError) as exc:
            self.up = False
            raise StoreUnavailable(
                f"redis at {self.where}: {type(exc).__name__}: {str(exc)[:160]}"
            ) from exc

    return wrapper  # type: ignore[return-value]


def _grant(value: object) -> tuple[float, float]:
    """A grant as kept in Redis: "until@at" (an older "until" alone reads as written at 0)."""
    until, _, at = _text(value).partition("@")
    return float(until), float(at or 0.0)


def _json(value: object) -> dict[str, Any]:
    """A stored JSON object; {} for a value we can not read."""
    try:
        data = json.loads(_text(value))
    except (TypeError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _text(value: object) -> str:
    """A Redis reply as text (the client decodes responses already; this keeps the type honest)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _approval_json(row: tuple[Any, ...]) -> str:
    approval_id, client, fingerprint, data, expires = row
    return json.dumps(
        {
            "id": approval_id,
            "client": client,
            "fingerprint": fingerprint,
            "data": data,
            "expires": repr(expires),  # as text: Lua's cjson would round a number to 14 digits
        }
    )


def _once_parse(value: object) -> OnceConsent | None:
    """An "approve once" as kept in Redis (numbers as text, when a script wrote it); None for a
    value we can not read."""
    try:
        one = json.loads(_text(value))
        cost = one.get("cost_usd")
        return OnceConsent(
            id=str(one["id"]),
            client=str(one["client"]),
            fingerprint=str(one["fingerprint"]),
            candidate=str(one["candidate"]),
            until=float(one["until"]),
            cost_usd=None if cost is None else float(cost),
        )
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def _approval_parse(value: object) -> ApprovalRecord | None:
    """An approval as kept in Redis; None for a value we can not read."""
    try:
        one = json.loads(_text(value))
        row = (one["id"], one["client"], one["fingerprint"], one["data"], one["expires"])
    except (ValueError, TypeError, KeyError):
        return None
    return approval_from((*row, one.get("decision")))


def redacted(url: str) -> str:
    """`url` without its password, for logs and pages."""
    parts = urlsplit(url)
    host = parts.hostname or "localhost"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


class RedisStore:
    kind = "redis"
    shared = True
    lost_reason = ""  # Redis restarted empty, or is met empty for the first time
    lease_poll_s = math.inf  # a probe's answer is published: no one asks again meanwhile

    def __init__(
        self,
        url: str,
        *,
        local: SQLiteStore,
        prefix: str = "lanes:",
        threads: int = 8,
        connect_timeout_s: float = 0.5,
        timeout_s: float = 2.0,
    ) -> None:
        self.where = redacted(url)
        self.local = local
        self.up = False  # until the first full sync: no paid reservation before the ledger is known
        self.host = uuid.uuid4().hex[:12]  # this process, in leases and published messages
        self.limiter = trio.CapacityLimiter(threads)
        self.listen_limiter = trio.CapacityLimiter(1)
        # a blocking pool: a call beyond the connections waits for one rather than failing as
        # "Redis down"
        pool = redis.BlockingConnectionPool.from_url(
            url,
            max_connections=threads + 4,
            timeout=timeout_s,
            socket_connect_timeout=connect_timeout_s,
            socket_timeout=timeout_s,
            decode_responses=True,
        )
        self._redis = redis.Redis(connection_pool=pool)
        self._p = prefix
        self.channel = f"{prefix}events"
        self._backoff = self._redis.register_script(BACKOFF)
        self._reserve = self._redis.register_script(RESERVE)
        self._settle = self._redis.register_script(SETTLE)
        self._restore = self._redis.register_script(RESTORE)
        self._max = self._redis.register_script(MAX)
        self._release = self._redis.register_script(RELEASE)
        self._lease = self._redis.register_script(LEASE)
        self._take_once = self._redis.register_script(TAKE_ONCE)
        self._put_approval = self._redis.register_script(PUT_APPROVAL)
        self._decide_approval = self._redis.register_script(DECIDE_APPROVAL)
        self._lock = threading.Lock()
        self._epoch: str | None = None
        self._reseed_due = False  # Redis forgot our state and we have not pushed our view back yet
        self._pubsub: Any = None
        # local caches, answered without a round trip
        self._spent: dict[int, float] = {}
        self._client_spent: dict[tuple[int, str], float] = {}  # as of this host's last reservation
        self._grants: dict[str, tuple[float, float]] = {}  # client → (until, written at)
        self._quarantine: dict[str, str] = {}
        # this host's writes waiting for the next sync, and what it must push back after a data loss
        self._settles: dict[str, float] = {}
        self._grant_writes: dict[str, tuple[float, float]] = {}
        self._switch_writes: dict[str, tuple[bool, float]] = {}
        self._quarantine_writes: dict[str, tuple[str | None, str, float]] = {}
        self._releases: list[tuple[str, bool, Backoff | None, str]] = []
        self._own: dict[str, tuple[int, float]] = {}  # reservation → (day, amount now counted)
        self._leases: dict[str, str] = {}  # scope → the token of the lease this host holds
        self._operator: terms.Operator | None = None  # what an operator set, as last seen

    @property
    def db(self) -> Any:
        return self.local.db

    def query(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return self.local.query(sql, args)

    def add_audit(self, rows: list[dict[str, Any]]) -> None:
        self.local.add_audit(rows)

    def prune_audit(self, before: float) -> int:
        return self.local.prune_audit(before)

    def _k(self, *parts: object) -> str:
        return self._p + ":".join(str(p) for p in parts)

    def _publish_message(self, kind: str, **fields: Any) -> str:
        return json.dumps({"t": kind, "from": self.host, **fields})

    # -- usage and spend ---------------------------------------------------------------------
    @_guarded
    def add_usage(
        self, rows: list[tuple[UsageKey, int]], spend: dict[tuple[str, int], float]
    ) -> None:
        if not rows and not spend:
            return
        pipe = self._redis.pipeline(transaction=False)
        for (scope, dimension, window, index), delta in rows:
            key = self._k("usage", window, index)
            pipe.hincrby(key, f"{scope}{SEP}{dimension}", delta)
            pipe.expireat(key, int(end_of(window, index)) + 60)
        for (lane, period), usd in spend.items():
            pipe.hincrbyfloat(self._k("spend"), f"{lane}{SEP}{period}", usd)
        pipe.execute()

    @_guarded
    def usage_totals(self, now: float) -> list[tuple[UsageKey, int]]:
        current = [(w, window_id(w, now)) for w in WINDOWS]
        pipe = self._redis.pipeline(transaction=False)
        for window, index in current:
            pipe.hgetall(self._k("usage", window, index))
        out: list[tuple[UsageKey, int]] = []
        for (window, index), fields in zip(current, pipe.execute(), strict=True):
            for field, count in fields.items():
                scope, _, dimension = _text(field).rpartition(SEP)
                out.append(((scope, dimension, window, index), int(count)))
        return out

    @_guarded
    def spend_totals(self) -> dict[tuple[str, int], float]:
        out: dict[tuple[str, int], float] = {}
        for field, usd in self._redis.hgetall(self._k("spend")).items():
            lane, _, period = _text(field).rpartition(SEP)
            out[(lane, int(period))] = float(usd)
        return out

    # -- backoffs and snapshots ---------------------------------------------------------------
    @_guarded
    def put_backoffs(self, backoffs: dict[str, Backoff], now: float | None = None) -> None:
        """Write backoffs (each keeps the later deadline of ours and theirs) and publish the ones
        that won."""
        if backoffs:
            pipe = self._redis.pipeline(transaction=False)
            self._queue_backoffs(pipe, backoffs, now)
            pipe.execute()

    def _queue_backoffs(self, pipe: Any, backoffs: dict[str, Backoff], now: float | None) -> None:
        floor = min(b.until for b in backoffs.values()) - 1.0 if now is None else now
        for scope, b in backoffs.items():
            value = json.dumps(backoff_fields(b))
            message = self._publish_message("backoff", scope=scope, **backoff_fields(b))
            self._backoff(
                keys=[self._k("backoff", scope), self._k("backoff-index")],
                args=[
                    scope,
                    repr(b.until),
                    str(int(b.until * 1000) + 1),
                    value,
                    self.channel,
                    message,
                    repr(floor),
                ],
                client=pipe,
            )

    @_guarded
    def backoffs(self, now: float) -> list[tuple[str, Backoff]]:
        scopes = [
            _text(s)
            for s in self._redis.zrangebyscore(self._k("backoff-index"), f"({now!r}", "+inf")
        ]
        if not scopes:
            return []
        values = self._redis.mget([self._k("backoff", s) for s in scopes])
        out: list[tuple[str, Backoff]] = []
        for scope, value in zip(scopes, values, strict=True):
            if value is None:
                continue  # expired between the two reads
            try:
                data = json.loads(value)
                out.append((scope, backoff_from(data)))
            except (ValueError, TypeError, KeyError):
                continue  # a value we can not read is skipped, never fatal
        return out

    @_guarded
    def put_snapshots(self, snapshots: dict[str, tuple[float, RateLimitSnapshot]]) -> None:
        if snapshots:
            self._redis.hset(
                self._k("snapshot"),
                mapping={
                    scope: json.dumps({"at": at, **_snapshot_data(snap)})
                    for scope, (at, snap) in snapshots.items()
                },
            )

    @_guarded
    def snapshots(self) -> dict[str, tuple[float, RateLimitSnapshot]]:
        out: dict[str, tuple[float, RateLimitSnapshot]] = {}
        for scope, value in self._redis.hgetall(self._k("snapshot")).items():
            try:
                data = json.loads(value)
                out[_text(scope)] = (float(data["at"]), _snapshot_from(data))
            except (ValueError, TypeError, KeyError):
                continue
        return out

    # -- the paid ledger ------------------------------------------------------------------------
    @_guarded
    def reserve_paid(
        self,
        *,
        day: int,
        amount: float,
        ceiling: float,
        lane: str,
        model: str,
        job: str,
        cohort: str | None,
        client: str | None = None,
        client_ceiling: float | None = None,
        wall: float | None = None,
        tolerance_s: float | None = None,
    ) -> str | None:
        """Reserve `amount` of the day's paid budget in one script across every host; None if it
        would cross `ceiling` or the store's terms' ceiling, whichever is lower (or, for a client
        with one, `client_ceiling`). The day is the server's (`day` is this host's guess; asked
        again once with the server's when it guessed wrong). Raises `ClockRefused` when `wall` is
        further than `tolerance_s` from the server's clock; refused (StoreUnavailable) while the
        ledger is not known to be whole."""
        if not self.up:
            raise StoreUnavailable(
                f"redis at {self.where}: the shared paid ledger is not synchronised yet"
            )
        tag = client.encode().hex() if client_ceiling is not None and client else ""
        checked = (
            ["", "0"] if wall is None or tolerance_s is None else [repr(wall), repr(tolerance_s)]
        )
        for _ in range(2):
            # one per attempt, never merged; day and client tag first, so settling finds the ledgers
            reservation = f"{day}:{tag}:{uuid.uuid4().hex}:{job}:{lane}/{model}"
            granted, total, mine, server = self._reserve(
                keys=[*self._ledger(day, tag), self._k("ceiling")],
                args=[
                    reservation,
                    pico(amount),
                    round(ceiling * PICO),
                    int(end_of("day", day)) + 86400,
                    round(client_ceiling * PICO) if tag and client_ceiling is not None else -1,
                    day,
                    *checked,
                ],
            )
            if int(granted) == -1:
                raise ClockRefused(float(server) - float(checked[0]))
            if int(granted) != -2:
                break
            day = window_id("day", float(server))  # midnight fell between our guess and the script
        else:
            return None  # the server's day changed twice within a call: refuse, never guess
        with self._lock:
            self._spent[day] = int(total) / PICO
            if tag and client:
                self._client_spent[(day, client)] = int(mine) / PICO
            if not int(granted):
                return None
            self._own[reservation] = (day, amount)
        return reservation

    def _ledger(self, day: int | str, tag: str = "") -> list[str]:
        """The day's ledger and total, then the client's (tagged by its hex name; "" for none)."""
        return [
            self._k("paid", day),
            self._k("paid-total", day),
            self._k("paid-client", day, tag),
            self._k("paid-client-total", day, tag),
        ]

    @staticmethod
    def _parts(reservation: str) -> tuple[str, str]:
        """(day, client tag) of a reservation id made here."""
        day, tag, *_ = reservation.split(":", 2)
        return day, tag

    def settle_paid(self, reservation: str, cost: float) -> None:
        """Replace a reservation by its real cost at the next sync (it counts in full until
        then)."""
        with self._lock:
            if reservation in self._own:
                day, _ = self._own[reservation]
                self._own[reservation] = (day, cost)
            self._settles[reservation] = cost

    def paid_spent(self, day: int, client: str | None = None) -> float:
        """Today's spend as of the last sync or reservation (all hosts); a client's own, when
        named, as of this host's last reservation for it."""
        with self._lock:
            if client is not None:
                return self._client_spent.get((day, client), 0.0)
            return self._spent.get(day, 0.0)

    # -- approvals, the kill switch, the quarantine ------------------------------------------
    def put_grant(self, client: str, until: float, at: float) -> None:
        """Grant `client` paid fallback until `until` (a past `until` revokes it). The write made
        last (`at`, epoch seconds) wins on every host, so a revocation sticks."""
        with self._lock:
            self._grants[client] = self._grant_writes[client] = (until, at)

    def grant_until(self, client: str) -> float | None:
        with self._lock:
            grant = self._grants.get(client)
        return None if grant is None else grant[0]

    def grants(self, now: float) -> dict[str, float]:
        with self._lock:
            return {client: until for client, (until, _) in self._grants.items() if until > now}

    @_guarded
    def put_once(self, once: OnceConsent) -> None:
        self._redis.hset(self._k("once"), once.id, json.dumps(attrs.asdict(once)))

    @_guarded
    def take_once(
        self,
        *,
        client: str,
        candidate: str,
        fingerprint: str,
        cost: float,
        approval: str | None,
        now: float,
    ) -> str | None:
        taken = self._take_once(
            keys=[self._k("once")],
            args=[client, candidate, fingerprint, repr(cost), approval or "", repr(now)],
        )
        return _text(taken) if taken else None

    @_guarded
    def onces(self, now: float) -> list[OnceConsent]:
        out = []
        for value in self._redis.hvals(self._k("once")):
            once = _once_parse(value)
            if once is not None and once.until > now:
                out.append(once)
        return out

    @_guarded
    def drop_once(self, once_id: str) -> bool:
        return bool(self._redis.hdel(self._k("once"), once_id))

    @_guarded
    def put_approval(self, approval: ApprovalRecord, now: float) -> None:
        self._put_approval(
            keys=[self._k("approval")],
            args=[approval.id, _approval_json(approval_row(approval)), repr(now - 86400.0)],
        )

    @_guarded
    def approvals(self, now: float) -> list[ApprovalRecord]:
        out = []
        for value in self._redis.hvals(self._k("approval")):
            approval = _approval_parse(value)
            if approval is not None and approval.expires_at > now:
                out.append(approval)
        return out

    @_guarded
    def decide_approval(
        self, approval_id: str, decision: str, now: float, once_until: float | None = None
    ) -> ApprovalRecord | None:
        decided = self._decide_approval(
            keys=[self._k("approval"), self._k("once")],
            args=[approval_id, decision, repr(now), "" if once_until is None else repr(once_until)],
        )
        return _approval_parse(decided) if decided else None

    def peek(self, now: float) -> News | None:
        return None  # other hosts' backoffs and switches are published (see `listen`)

    def put_switch(self, lane: str, off: bool, at: float) -> None:
        with self._lock:
            self._switch_writes[lane] = (off, at)

    @_guarded
    def switches(self) -> set[str]:
        off = {_text(lane) for lane in self._redis.hkeys(self._k("switch"))}
        with self._lock:  # changes made here since the last flush win over what Redis said
            for lane, (is_off, _) in self._switch_writes.items():
                (off.add if is_off else off.discard)(lane)
        return off

    def quarantined(self) -> dict[str, str]:
        try:
            rows = self._read_quarantine()
        except StoreUnavailable:
            pass  # the last view stands
        else:
            with self._lock:
                self._quarantine = rows
        with self._lock:
            return dict(self._quarantine)

    @_guarded
    def _read_quarantine(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for key, value in self._redis.hgetall(self._k("quarantine")).items():
            try:
                data = json.loads(value)
                out[_text(key)] = f"quarantined by the canary ({data['verdict']}: {data['reason']})"
            except (ValueError, TypeError, KeyError):
                continue
        return out

    def set_quarantine(
        self, key: str, verdict: str | None, reason: str = "", at: float = 0.0
    ) -> None:
        """Write now when Redis answers; otherwise at the next sync that reaches it."""
        self.local.set_quarantine(key, verdict, reason, at)
        with self._lock:
            self._quarantine_writes[key] = (verdict, reason, at)
        with contextlib.suppress(StoreUnavailable):  # kept, and written by the next flush
            self._flush_quarantine()

    @_guarded
    def _flush_quarantine(self) -> None:
        with self._lock:
            writes, self._quarantine_writes = self._quarantine_writes, {}
        try:
            pipe = self._redis.pipeline(transaction=False)
            for key, (verdict, reason, at) in writes.items():
                if verdict is None:
                    pipe.hdel(self._k("quarantine"), key)
                else:
                    pipe.hset(
                        self._k("quarantine"),
                        key,
                        json.dumps({"verdict": verdict, "reason": reason, "at": at}),
                    )
            pipe.execute()
        except Exception:  # put the writes back, then report
            with self._lock:
                self._quarantine_writes = {**writes, **self._quarantine_writes}
            raise

    # -- probes -------------------------------------------------------------------------------
    @_guarded
    def probe_lease(self, scope: str, ttl_s: float, now: float | None = None) -> bool | Backoff:
        """Take the right to probe a cold or reopened scope for every host (expires after `ttl_s`,
        on Redis's clock: `now` is not needed): True when taken, False when another host holds it,
        the scope's backoff when one is in force."""
        token = f"{self.host}:{uuid.uuid4().hex[:8]}"
        outcome, value = self._lease(
            keys=[self._k("probe", scope), self._k("backoff", scope)],
            args=[token, max(1, int(min(ttl_s, 3600.0) * 1000)), f"{self.host}:"],
        )
        if outcome == 2:
            data = json.loads(value)
            return backoff_from(data)
        if outcome == 1:
            with self._lock:
                self._leases[scope] = token
            return True
        return False

    def probe_done(self, scope: str, ok: bool, backoff: Backoff | None = None) -> None:
        """Release the lease at the next flush — after writing the backoff the probe caused, in the
        same pipeline, so no host can take the lease before the closed door is on record."""
        with self._lock:
            if scope in self._leases:
                self._releases.append((scope, ok, backoff, self._leases.pop(scope)))

    # -- terms and clocks ----------------------------------------------------------------------
    @property
    def host_id(self) -> str:
        return self.host

    @_guarded
    def heartbeat(self, beat: terms.Beat) -> terms.Pulse | None:
        """This host's beat, stamped with the server's clock (TIME), and the store's terms it
        settles, in one optimistic transaction (WATCH): no host settles on hosts or an operator's
        terms another is changing. None when others kept changing them (the next sync beats)."""
        hosts_key, operator_key = self._k("hosts"), self._k("operator")
        with self._redis.pipeline() as pipe:
            for _ in range(5):
                try:
                    pipe.watch(hosts_key, operator_key)  # type: ignore[no-untyped-call, unused-ignore]  # unannotated
                    seconds, micros = pipe.time()
                    now = seconds + micros / 1e6
                    hosts = [
                        h
                        for host_id, data in pipe.hgetall(hosts_key).items()
                        if (h := terms.host_from(_text(host_id), _json(data))) is not None
                    ]
                    raw = pipe.get(operator_key)
                    operator = None if raw is None else terms.operator_from(_json(raw))
                    own, gone, pulse = terms.beat(hosts, operator, beat, now)
                    pipe.multi()
                    pipe.hset(hosts_key, beat.host, json.dumps(terms.host_fields(own)))
                    if gone:
                        pipe.hdel(hosts_key, *gone)
                    if pulse.settled is not None:
                        pipe.set(self._k("ceiling"), round(pulse.settled.terms.ceiling_usd * PICO))
                    pipe.execute()
                except redis.WatchError:
                    continue
                with self._lock:
                    self._operator = operator
                return attrs.evolve(pulse, store_time=now)
        return None

    @_guarded
    def set_terms(self, operator: terms.Operator) -> None:
        """Keep what an operator set (stamped with the server's clock), over what was set before."""
        key = self._k("operator")
        with self._redis.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(key)  # type: ignore[no-untyped-call, unused-ignore]  # unannotated in redis-py
                    seconds, micros = pipe.time()
                    now = seconds + micros / 1e6
                    raw = pipe.get(key)
                    old = (None if raw is None else terms.operator_from(_json(raw))) or (
                        terms.Operator()
                    )
                    stamped = attrs.evolve(operator, ceiling_at=now, consent_at=now)
                    pipe.multi()
                    pipe.set(key, json.dumps(terms.operator_fields(terms.merged(old, stamped))))
                    pipe.execute()
                    return
                except redis.WatchError:
                    continue

    @_guarded
    def withdraw(self) -> None:
        """Leave: this host's announcement holds no one back any more."""
        self._redis.hdel(self._k("hosts"), self.host)

    # -- the sync ---------------------------------------------------------------------------
    @_guarded
    def begin_sync(self, now: float) -> bool:
        """Refresh the cached ledger and grants; True when Redis lost our shared state (a restart
        without persistence, or a first contact with an empty Redis) and it has not been pushed back
        yet: the caller then passes its view to `reseed` (asked again until a reseed succeeds)."""
        day = window_id("day", now)
        pipe = self._redis.pipeline(transaction=False)
        pipe.get(self._k("epoch"))
        for near in (day - 1, day, day + 1):  # the server's day may be either side of ours
            pipe.get(self._k("paid-total", near))
        pipe.hgetall(self._k("grant"))
        epoch, *totals, grants = pipe.execute()
        self._reseed_due |= epoch is None or (self._epoch is not None and epoch != self._epoch)
        if epoch is None:
            self._redis.set(self._k("epoch"), uuid.uuid4().hex, nx=True)
            epoch = self._redis.get(self._k("epoch"))
        self._epoch = epoch
        with self._lock:
            self._spent = {
                near: int(total or 0) / PICO
                for near, total in zip((day - 1, day, day + 1), totals, strict=True)
            }
            if any(
                d < day - 1 for d, _ in self._own.values()
            ):  # only today's and yesterday's can need pushing back
                self._own = {r: (d, amount) for r, (d, amount) in self._own.items() if d >= day - 1}
            merged = {_text(client): _grant(value) for client, value in grants.items()}
            for client, written in self._grant_writes.items():  # our unflushed writes are newer
                if written[1] >= merged.get(client, (0.0, 0.0))[1]:
                    merged[client] = written
            self._grants = merged
        return self._reseed_due

    @_guarded
    def reseed(self, view: LocalView, now: float) -> None:
        """Push this host's view into a Redis that forgot it: counts and spend by maximum, backoffs
        by the later deadline, our unexpired reservations, grants, kill switches and quarantines."""
        pipe = self._redis.pipeline(transaction=False)
        by_window: dict[tuple[WindowName, int], list[str]] = {}
        for (scope, dimension, window, index), count in view.usage:
            by_window.setdefault((window, index), []).extend(
                [f"{scope}{SEP}{dimension}", str(count)]
            )
        for (window, index), pairs in by_window.items():
            self._max(
                keys=[self._k("usage", window, index)],
                args=[int(end_of(window, index)) + 60, *pairs],
                client=pipe,
            )
        if view.spend:
            self._max(
                keys=[self._k("spend")],
                args=[
                    0,
                    *[
                        v
                        for (lane, period), usd in view.spend.items()
                        for v in (f"{lane}{SEP}{period}", repr(usd))
                    ],
                ],
                client=pipe,
            )
        pipe.execute()
        self.put_backoffs({s: b for s, b in view.backoffs.items() if b.until > now}, now)
        self.put_snapshots(view.snapshots)
        pipe = self._redis.pipeline(transaction=False)
        with self._lock:
            for reservation, (day, amount) in self._own.items():
                tag = self._parts(reservation)[1]
                self._restore(
                    keys=self._ledger(day, tag),
                    args=[
                        reservation,
                        pico(amount),
                        int(end_of("day", day)) + 86400,
                        "1" if tag else "0",
                    ],
                    client=pipe,
                )
            for client, grant in self._grants.items():
                self._grant_writes.setdefault(client, grant)  # revocations too: they are newer
            for lane in view.switched_off:
                self._switch_writes.setdefault(lane, (True, now))
            if self._operator is not None:  # what an operator set, as this host last saw it
                pipe.set(
                    self._k("operator"), json.dumps(terms.operator_fields(self._operator)), nx=True
                )
            for key, reason in self._quarantine.items():
                pipe.hsetnx(
                    self._k("quarantine"),
                    key,
                    json.dumps({"verdict": "restored", "reason": reason, "at": now}),
                )
        pipe.execute()
        self._reseed_due = False

    @_guarded
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
            for reservation, cost in settles.items():
                self._settle(
                    keys=self._ledger(*self._parts(reservation)),
                    args=[reservation, pico(cost)],
                    client=pipe,
                )
            for client, (until, at) in grants.items():
                pipe.hset(self._k("grant"), client, f"{until!r}@{at!r}")
                pipe.publish(
                    self.channel, self._publish_message("grant", client=client, until=until, at=at)
                )
            for lane, (off, at) in switches.items():
                if off:
                    pipe.hset(self._k("switch"), lane, repr(at))
                else:
                    pipe.hdel(self._k("switch"), lane)
                pipe.publish(self.channel, self._publish_message("switch", lane=lane, off=off))
            for scope, ok, backoff, token in releases:
                if backoff is not None:
                    self._queue_backoffs(pipe, {scope: backoff}, None)
                self._release(
                    keys=[self._k("probe", scope)],
                    args=[
                        token,
                        self.channel,
                        self._publish_message("probe", scope=scope, ok=ok),
                    ],
                    client=pipe,
                )
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
    @_guarded
    def listen(self, timeout_s: float) -> list[dict[str, Any]]:
        """Block up to `timeout_s` (in a worker thread) for what other hosts published; grants are
        applied to the cache here, the rest is returned for the dispatcher to apply."""
        try:
            if self._pubsub is None:
                pubsub = self._redis.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call, unused-ignore]  # redis-py leaves pubsub() unannotated
                pubsub.subscribe(self.channel)
                self._pubsub = pubsub
            events = []
            message = self._pubsub.get_message(timeout=timeout_s)
            while message is not None:
                try:
                    event = json.loads(message["data"])
                except (ValueError, TypeError):
                    event = None
                if isinstance(event, dict) and event.get("from") != self.host:
                    if event.get("t") == "grant":
                        heard = (float(event["until"]), float(event.get("at", 0.0)))
                        with self._lock:
                            if heard[1] >= self._grants.get(event["client"], (0.0, 0.0))[1]:
                                self._grants[event["client"]] = heard
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
        self.local.close()

"""Shared state behind one `Store` interface: usage, credit spend, header snapshots, backoffs, the
paid ledger, approvals, the runtime kill switch and the canary's quarantine.

`SQLiteStore` (here) shares them between the processes of one host; `RedisStore`
(`redis_store.py`, selected by `state = "redis://…"`) between hosts.

One SQLite file (WAL) per host is shared by every process that opens it — the sidecar and the jobs
that import the dispatcher — so their backoffs and counts coordinate. Times are wall-clock epoch
seconds. Each call is one short transaction (WAL, synchronous=NORMAL: durable across a process
crash, no fsync per commit); usage and spend are flushed every half second, so a crash loses at most
that much counting.
"""

from __future__ import annotations

import functools
import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Protocol, TypeVar

import attrs
import trio

from lanes._core.state import audit_tables, host, terms
from lanes._core.state.host import ApprovalRecord as ApprovalRecord  # a Store record
from lanes._core.state.sqlite_file import connect, identity, reopen
from lanes.freetier.backoff import LADDERS, Backoff
from lanes.freetier.headers import RateLimitSnapshot, Window
from lanes.freetier.windows import WINDOWS, window_id
from lanes.freetier.windows import Key as UsageCounterKey

UsageKey = UsageCounterKey  # (scope, dimension, window, window id)

# A backslash at the end of a line joins it to the next (Python drops both): the SQL is unchanged.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    scope TEXT, dimension TEXT, window TEXT, window_id INTEGER, count INTEGER,
    PRIMARY KEY (scope, dimension, window, window_id));
CREATE TABLE IF NOT EXISTS spend (lane TEXT, period INTEGER, usd FLOAT, PRIMARY KEY (lane, period));
CREATE TABLE IF NOT EXISTS backoff (
    scope TEXT PRIMARY KEY, until FLOAT, step INTEGER, reason TEXT, source TEXT);
CREATE TABLE IF NOT EXISTS snapshot (scope TEXT PRIMARY KEY, at FLOAT, data TEXT);
CREATE TABLE IF NOT EXISTS paid_ledger (
    id TEXT PRIMARY KEY, day INTEGER, reserved FLOAT, settled FLOAT, lane TEXT, model TEXT,
    job TEXT, cohort TEXT, client TEXT);
CREATE INDEX IF NOT EXISTS idx_paid_ledger_day ON paid_ledger (day);
CREATE TABLE IF NOT EXISTS "grant" (client TEXT PRIMARY KEY, until FLOAT);
CREATE TABLE IF NOT EXISTS once_consent (
    id TEXT PRIMARY KEY, client TEXT, fingerprint TEXT, candidate TEXT, until FLOAT,
    cost_usd FLOAT);
CREATE TABLE IF NOT EXISTS quarantine (key TEXT PRIMARY KEY, verdict TEXT, reason TEXT, at FLOAT);
CREATE TABLE IF NOT EXISTS switch (lane TEXT PRIMARY KEY, at FLOAT);
"""
_FULL_SCHEMA = _SCHEMA + host.SCHEMA + audit_tables.SCHEMA
#: Columns added since the first release of each table, for `_migrate`.
_ADDED: dict[str, tuple[tuple[str, str], ...]] = {
    "paid_ledger": (("client", "TEXT"),),
    "once_consent": (("cost_usd", "FLOAT"),),  # NULL in an older file's onces: they never match
}
T = TypeVar("T")


class StoreUnavailable(Exception):
    """A shared store that can not be reached right now (Redis down, or not yet resynchronised)."""


class ClockRefused(Exception):
    """The store's clock refused a reservation: this process's wall is off by `skew_s` (the
    store's clock minus the wall) — more than the tolerance."""

    def __init__(self, skew_s: float) -> None:
        super().__init__(f"the store's clock is {skew_s:+.1f}s from this process's wall")
        self.skew_s = skew_s


STORE_ERRORS: tuple[type[Exception], ...] = (sqlite3.Error, StoreUnavailable)


@attrs.frozen(kw_only=True)
class OnceConsent:
    """An "approve once", kept from its decision until one request consumes it (or `until`, epoch
    seconds): a job of `client` for the very request approved (`fingerprint`) on `candidate`,
    whose worst case is at most the approved `cost_usd` — the first waiting job, or the client's
    retry."""

    id: str  # the approval's id
    client: str
    fingerprint: str  # the request approved (`Job.request_fingerprint`)
    candidate: str  # the paid "lane/model" approved
    until: float
    cost_usd: float | None = None  # the approved worst case; None (an older version's): no match


@attrs.frozen(kw_only=True)
class News:
    """What the other processes sharing a store wrote since the last look (see `Store.peek`)."""

    backoffs: list[tuple[str, Backoff]]
    switches: set[str]  # every lane switched off now


@attrs.frozen(kw_only=True)
class LocalView:
    """What this process knows, pushed back into a shared store that lost its data (a Redis restart
    without persistence): counters and spend by their maximum, backoffs keeping the later
    deadline."""

    usage: list[tuple[UsageKey, int]]
    spend: dict[tuple[str, int], float]
    backoffs: dict[str, Backoff]
    snapshots: dict[str, tuple[float, RateLimitSnapshot]]
    switched_off: frozenset[str]
    operator: terms.Operator | None = None  # what an operator set, as this process last saw it


#: The deadline (trio's clock) of the job on whose behalf store calls are made now, if any: set by
#: the walk, so every store call a job waits on is bounded by that job's deadline.
job_deadline: ContextVar[float | None] = ContextVar("lanes_job_deadline", default=None)


async def call(store: Store, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run one store call from trio: inline for a local store (SQLite: a short local transaction,
    cheaper than a thread hop, and deterministic under the autojump clock), in a worker thread
    bounded by the store's limiter for a networked one (Redis), so the event loop never waits on a
    socket. Inside a job (`job_deadline` set) the wait ends at the job's deadline: the thread is
    abandoned to finish on its own and `StoreUnavailable` is raised."""
    if store.limiter is None:
        return fn(*args, **kwargs)
    work = functools.partial(fn, *args, **kwargs)
    deadline = job_deadline.get()
    if deadline is None:
        return await trio.to_thread.run_sync(work, limiter=store.limiter)
    with trio.move_on_at(deadline):
        return await trio.to_thread.run_sync(work, limiter=store.limiter, abandon_on_cancel=True)
    raise StoreUnavailable(f"{store.where}: no answer before the job's deadline")


class Store(Protocol):
    """What the dispatcher needs from shared state. Reads on the hot path come from local caches;
    `call()` runs the rest (inline for SQLite, in a worker thread for Redis)."""

    @property
    def kind(self) -> str: ...  # "sqlite" or "redis"
    # shared between hosts: probes take a lease, changes are published
    @property
    def shared(self) -> bool: ...
    # None: calls run inline on the trio thread
    @property
    def limiter(self) -> trio.CapacityLimiter | None: ...
    # the thread that hears other hosts
    @property
    def listen_limiter(self) -> trio.CapacityLimiter | None: ...
    # reachable (and, for a shared ledger, resynchronised) at the last try
    @property
    def up(self) -> bool: ...
    @property
    def where(self) -> str: ...  # the file, or the Redis URL without its password
    @property
    def lost_reason(self) -> str: ...  # why the last `begin_sync` asked for a reseed ("": unknown)
    @property
    def db(self) -> Any: ...  # a sqlite-utils view of this host's file (audit, canary answers)

    def add_usage(
        self, rows: list[tuple[UsageKey, int]], spend: dict[tuple[str, int], float]
    ) -> None: ...
    def usage_totals(self, now: float) -> list[tuple[UsageKey, int]]: ...
    def spend_totals(self) -> dict[tuple[str, int], float]: ...
    def put_backoffs(self, backoffs: dict[str, Backoff], now: float | None = None) -> None: ...
    def backoffs(self, now: float) -> list[tuple[str, Backoff]]: ...
    def put_snapshots(self, snapshots: dict[str, tuple[float, RateLimitSnapshot]]) -> None: ...
    def snapshots(self) -> dict[str, tuple[float, RateLimitSnapshot]]: ...
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
    ) -> str | None: ...
    def settle_paid(self, reservation: str, cost: float) -> None: ...
    def paid_spent(self, day: int, client: str | None = None) -> float: ...
    def put_grant(self, client: str, until: float, at: float) -> None: ...
    def grant_until(self, client: str) -> float | None: ...
    def grants(self, now: float) -> dict[str, float]: ...
    def put_once(self, once: OnceConsent) -> None: ...
    def take_once(
        self,
        *,
        client: str,
        candidate: str,
        fingerprint: str,
        cost: float,
        approval: str | None,
        now: float,
    ) -> str | None: ...
    def onces(self, now: float) -> list[OnceConsent]: ...
    def drop_once(self, once_id: str) -> bool: ...
    def add_audit(self, rows: list[dict[str, Any]]) -> None: ...
    def prune_audit(self, before: float) -> int: ...
    def quarantined(self) -> dict[str, str]: ...
    def set_quarantine(
        self, key: str, verdict: str | None, reason: str = "", at: float = 0.0
    ) -> None: ...
    def put_switch(self, lane: str, off: bool, at: float) -> None: ...
    def switches(self) -> set[str]: ...
    # how often a job waiting on another process's probe asks again (inf: it is told, by events)
    @property
    def lease_poll_s(self) -> float: ...
    def probe_lease(self, scope: str, ttl_s: float, now: float | None = None) -> bool | Backoff: ...
    def probe_done(self, scope: str, ok: bool, backoff: Backoff | None = None) -> None: ...
    def peek(self, now: float) -> News | None: ...
    def put_approval(self, approval: ApprovalRecord, now: float) -> None: ...
    def approvals(self, now: float) -> list[ApprovalRecord]: ...
    def decide_approval(
        self, approval_id: str, decision: str, now: float, once_until: float | None = None
    ) -> ApprovalRecord | None: ...
    def listen(self, timeout_s: float) -> list[dict[str, Any]]: ...
    # terms and clocks (see terms.py): this process in the store, its beat, an operator's terms
    @property
    def host_id(self) -> str: ...
    def heartbeat(self, beat: terms.Beat) -> terms.Pulse | None: ...
    def set_terms(self, operator: terms.Operator) -> None: ...
    def withdraw(self) -> None: ...
    def query(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]: ...
    def begin_sync(self, now: float) -> bool: ...
    def reseed(self, view: LocalView, now: float) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


def _migrate(conn: sqlite3.Connection) -> None:
    """Give a file made by an older version the columns this one writes and reads."""
    for table, columns in _ADDED.items():
        have = {row[1] for row in conn.execute(f'PRAGMA table_info("{table}")')}
        for name, kind in columns:
            if name not in have:
                conn.execute(f'ALTER TABLE "{table}" ADD COLUMN {name} {kind}')
    conn.execute("CREATE INDEX IF NOT EXISTS idx_paid_ledger_client ON paid_ledger (day, client)")
    audit_tables.migrate(conn)


class SQLiteStore:
    """The default store: one SQLite file; `:memory:` keeps everything in this process only.

    The file is checked at every sync and before every paid reservation: when it was deleted or
    replaced under this process, paid reservations are refused (`StoreUnavailable`) until the file
    at the path has been opened again — created afresh when missing — and this process's view
    (counts, spend, backoffs, its own unexpired paid reservations, kill switches) written back into
    it, as with a Redis that lost its data (see `begin_sync` and `reseed`)."""

    kind = "sqlite"
    shared = False
    limiter: trio.CapacityLimiter | None = None
    listen_limiter: trio.CapacityLimiter | None = None
    lease_poll_s = 0.02  # a job waiting on another process's probe looks again this often

    def __init__(self, path: str) -> None:
        self.where = path
        self._path = path if path == ":memory:" else str(Path(path).expanduser())
        self._conn = connect(self._path, _FULL_SCHEMA, _migrate)
        self._identity = identity(self._path) if self._path != ":memory:" else None
        self._lock = threading.Lock()
        self._db: Any = None
        self.up = True  # False from a deleted or replaced file until it is reopened and reseeded
        self.lost_reason = ""  # why the last reseed was needed, for the sync's one log line
        # this process's paid reservations of today and yesterday: (day, amount, lane, model, job,
        # cohort, client, settled); written back when the file is found replaced
        self._own: dict[
            str, tuple[int, float, str, str, str, str | None, str | None, float | None]
        ] = {}
        self._process = uuid.uuid4().hex[:12]  # this process, in the tokens of its probe leases
        self._leases: dict[str, str] = {}  # scope → the token of the lease this process holds
        self._word = host.ChangeWord(None if path == ":memory:" else f"{self._path}-changes")

    def _moved(self) -> str:
        """Why the file at the path is no longer the one this process opened ('' when it is)."""
        if self._path == ":memory:":
            return ""
        now = identity(self._path)
        if now == self._identity:
            return ""
        return "the state file was deleted" if now is None else "the state file was replaced"

    @property
    def db(self) -> Any:
        """A sqlite-utils view of the same connection, for tables that grow (audit, canary).

        Imported on first use: it is a fifth of the sidecar's import time, and `/health` must
        answer within a second of launch."""
        if self._db is None:
            import sqlite_utils

            self._db = sqlite_utils.Database(self._conn)
        return self._db

    def add_usage(
        self, rows: list[tuple[UsageKey, int]], spend: dict[tuple[str, int], float]
    ) -> None:
        with self._lock, self._conn:
            self._conn.executemany(
                "INSERT INTO usage (scope, dimension, window, window_id, count) "
                "VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (scope, dimension, window, window_id) "
                "DO UPDATE SET count = count + excluded.count",
                [(*key, delta) for key, delta in rows],
            )
            self._conn.executemany(
                "INSERT INTO spend (lane, period, usd) VALUES (?, ?, ?) "
                "ON CONFLICT (lane, period) DO UPDATE SET usd = usd + excluded.usd",
                [(lane, period, usd) for (lane, period), usd in spend.items()],
            )

    def usage_totals(self, now: float) -> list[tuple[UsageKey, int]]:
        current = [(w, window_id(w, now)) for w in WINDOWS]
        clause = " OR ".join("(window = ? AND window_id = ?)" for _ in current)
        args = [v for pair in current for v in pair]
        with self._lock:
            rows = self._conn.execute(
                f"SELECT scope, dimension, window, window_id, count FROM usage WHERE {clause}", args
            ).fetchall()
        return [((s, d, w, i), c) for s, d, w, i, c in rows]

    def spend_totals(self) -> dict[tuple[str, int], float]:
        with self._lock:
            return {
                (lane, period): usd
                for lane, period, usd in self._conn.execute("SELECT lane, period, usd FROM spend")
            }

    def put_backoffs(self, backoffs: dict[str, Backoff], now: float | None = None) -> None:
        """Write backoffs, keeping the later deadline when another process wrote one too."""
        with self._lock, self._conn:
            self._conn.executemany(
                "INSERT INTO backoff (scope, until, step, reason, source) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (scope) DO UPDATE SET until = excluded.until, step = excluded.step, "
                "reason = excluded.reason, source = excluded.source "
                "WHERE excluded.until > backoff.until",
                [(scope, b.until, b.step, b.reason, b.source) for scope, b in backoffs.items()],
            )
        if backoffs:
            self._word.bump()  # the other processes look before their next attempt

    def backoffs(self, now: float) -> list[tuple[str, Backoff]]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT scope, until, step, reason, source FROM backoff WHERE until > ?", (now,)
            ).fetchall()
        out = []
        for scope, until, step, reason, source in rows:
            try:
                out.append((scope, backoff_from({"u": until, "s": step, "r": reason, "o": source})))
            except (ValueError, TypeError, KeyError):
                continue  # a row we can not read is skipped, never fatal
        return out

    def put_snapshots(self, snapshots: dict[str, tuple[float, RateLimitSnapshot]]) -> None:
        with self._lock, self._conn:
            self._conn.executemany(
                "INSERT OR REPLACE INTO snapshot (scope, at, data) VALUES (?, ?, ?)",
                [
                    (scope, at, json.dumps(_snapshot_data(snap)))
                    for scope, (at, snap) in snapshots.items()
                ],
            )

    def snapshots(self) -> dict[str, tuple[float, RateLimitSnapshot]]:
        with self._lock:
            rows = self._conn.execute("SELECT scope, at, data FROM snapshot").fetchall()
        out = {}
        for scope, at, data in rows:
            try:
                out[scope] = (at, _snapshot_from(json.loads(data)))
            except (ValueError, TypeError, KeyError):
                continue  # a row we can not read is skipped, never fatal
        return out

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
        """Reserve `amount` USD of today's paid budget, atomically across processes; None if it
        would cross `ceiling` or the store's terms' ceiling, whichever is lower — or, for a
        `client` with a ceiling of its own, `client_ceiling`. Unsettled reservations count in
        full, so a crash never under-counts. (`wall` and `tolerance_s` are for a store with a clock
        of its own: the processes of one host share the host's, which the ledger checks.)"""
        reservation = f"{job}:{lane}/{model}:{uuid.uuid4().hex}"  # one per attempt, never merged
        self._check_file()
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                shared = host.shared_ceiling(self._conn)
                ceiling = ceiling if shared is None else min(ceiling, shared)
                over = self._spent(day) + amount > ceiling + 1e-12
                if not over and client_ceiling is not None:
                    over = self._spent(day, client) + amount > client_ceiling + 1e-12
                if over:
                    self._conn.execute("ROLLBACK")
                    return None
                self._conn.execute(
                    "INSERT OR REPLACE INTO paid_ledger "
                    "(id, day, reserved, settled, lane, model, job, cohort, client) "
                    "VALUES (?, ?, ?, NULL, ?, ?, ?, ?, ?)",
                    (reservation, day, amount, lane, model, job, cohort, client),
                )
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise
            if self._path != ":memory:":
                self._own[reservation] = (day, amount, lane, model, job, cohort, client, None)
        return reservation

    def settle_paid(self, reservation: str, cost: float) -> None:
        """Replace a reservation by what the attempt really cost, as reported by its usage."""
        with self._lock, self._conn:
            self._conn.execute(
                "UPDATE paid_ledger SET settled = ? WHERE id = ?", (cost, reservation)
            )
            if reservation in self._own:
                self._own[reservation] = (*self._own[reservation][:7], cost)

    def paid_spent(self, day: int, client: str | None = None) -> float:
        with self._lock:
            return self._spent(day, client)

    def _spent(self, day: int, client: str | None = None) -> float:
        """Reserved-or-settled USD of `day` (unsettled reservations count in full), all clients'
        or one's. Hold the lock."""
        where, args = (
            ("day = ?", (day,)) if client is None else ("day = ? AND client = ?", (day, client))
        )
        (spent,) = self._conn.execute(
            f"SELECT COALESCE(SUM(COALESCE(settled, reserved)), 0) FROM paid_ledger WHERE {where}",
            args,
        ).fetchone()
        return float(spent)

    def put_grant(self, client: str, until: float, at: float) -> None:
        """Grant `client` paid fallback until `until` (a past `until` revokes it); the last write
        wins."""
        with self._lock, self._conn:
            self._conn.execute(
                'INSERT OR REPLACE INTO "grant" (client, until) VALUES (?, ?)', (client, until)
            )

    def grants(self, now: float) -> dict[str, float]:
        """Every client's grant in force at `now`: client → until."""
        with self._lock:
            rows = self._conn.execute('SELECT client, until FROM "grant" WHERE until > ?', (now,))
            return {client: float(until) for client, until in rows}

    def put_once(self, once: OnceConsent) -> None:
        """Keep an "approve once" decision for the client's next matching request."""
        with self._lock, self._conn:
            _insert_once(self._conn, once)

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
        """Consume, atomically across processes, an "approve once" of `client` for this very
        request (`fingerprint`) on `candidate`, approved for a worst case of at least `cost` USD —
        the one named `approval` first; its id, or None. Expired ones are dropped."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._conn.execute("DELETE FROM once_consent WHERE until <= ?", (now,))
                row = self._conn.execute(
                    "SELECT id FROM once_consent WHERE client = ? AND candidate = ? "
                    "AND fingerprint = ? AND cost_usd IS NOT NULL AND cost_usd + 1e-12 >= ? "
                    "ORDER BY id = ? DESC LIMIT 1",
                    (client, candidate, fingerprint, cost, approval or ""),
                ).fetchone()
                if row is not None:
                    self._conn.execute("DELETE FROM once_consent WHERE id = ?", (row[0],))
                self._conn.execute("COMMIT")
            finally:  # whatever happened, the transaction does not outlive the call
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
        return None if row is None else str(row[0])

    def onces(self, now: float) -> list[OnceConsent]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT id, client, fingerprint, candidate, until, cost_usd FROM once_consent "
                "WHERE until > ?",
                (now,),
            ).fetchall()
        return [
            OnceConsent(id=i, client=c, fingerprint=f, candidate=k, until=u, cost_usd=usd)
            for i, c, f, k, u, usd in rows
        ]

    def drop_once(self, once_id: str) -> bool:
        with self._lock, self._conn:
            return (
                self._conn.execute("DELETE FROM once_consent WHERE id = ?", (once_id,)).rowcount > 0
            )

    def grant_until(self, client: str) -> float | None:
        with self._lock:
            row = self._conn.execute(
                'SELECT until FROM "grant" WHERE client = ?', (client,)
            ).fetchone()
        return row[0] if row else None

    def add_audit(self, rows: list[dict[str, Any]]) -> None:
        """Write audit rows (each with its `attempt_rows`): `audit`, `audit_attempt` and the hourly
        roll-ups, in one transaction."""
        if rows:
            with self._lock:
                audit_tables.write(self._conn, rows)

    def prune_audit(self, before: float) -> int:
        """Delete the audit of jobs older than `before` (epoch seconds); how many jobs went."""
        with self._lock:
            return audit_tables.prune(self._conn, before)

    def quarantined(self) -> dict[str, str]:
        """Candidates ("lane/model") the canary took out of routing, with the reason."""
        with self._lock:
            return {
                key: f"quarantined by the canary ({verdict}: {reason})"
                for key, verdict, reason in self._conn.execute(
                    "SELECT key, verdict, reason FROM quarantine"
                )
            }

    def set_quarantine(
        self, key: str, verdict: str | None, reason: str = "", at: float = 0.0
    ) -> None:
        """Quarantine `key` with a verdict, or release it (verdict None)."""
        with self._lock, self._conn:
            if verdict is None:
                self._conn.execute("DELETE FROM quarantine WHERE key = ?", (key,))
            else:
                self._conn.execute(
                    "INSERT OR REPLACE INTO quarantine (key, verdict, reason, at) "
                    "VALUES (?, ?, ?, ?)",
                    (key, verdict, reason, at),
                )

    def put_switch(self, lane: str, off: bool, at: float) -> None:
        """The runtime kill switch, obeyed by every process sharing the file."""
        with self._lock, self._conn:
            if off:
                self._conn.execute(
                    "INSERT OR REPLACE INTO switch (lane, at) VALUES (?, ?)", (lane, at)
                )
            else:
                self._conn.execute("DELETE FROM switch WHERE lane = ?", (lane,))
        self._word.bump()  # every process obeys it from its next job on

    def switches(self) -> set[str]:
        with self._lock:
            return {lane for (lane,) in self._conn.execute("SELECT lane FROM switch")}

    # -- what the processes of the host coordinate through the file (see host.py) ------------------
    def probe_lease(self, scope: str, ttl_s: float, now: float | None = None) -> bool | Backoff:
        """Take the right to probe a cold or reopened scope for every process sharing the file, for
        `ttl_s` from `now` (epoch seconds): True when taken, False while another process holds it,
        the scope's backoff when one is in force. In memory there is no one else: always True."""
        if self._path == ":memory:":
            return True
        now = time.time() if now is None else now  # wall-clock: shared with other processes
        token = f"{self._process}:{uuid.uuid4().hex[:8]}"
        with self._lock:
            taken = host.take_lease(
                self._conn, scope, token=token, mine=f"{self._process}:", until=now + ttl_s, now=now
            )
            if taken is True:
                self._leases[scope] = token
        if isinstance(taken, tuple):
            until, step, reason, source = taken
            return backoff_from({"u": until, "s": step, "r": reason, "o": source})
        return taken

    def probe_done(self, scope: str, ok: bool, backoff: Backoff | None = None) -> None:
        """Release this process's lease of `scope` (if it holds one) together with the backoff the
        probe caused, written first. Raises `sqlite3.Error` when the file is busy past its timeout:
        the lease then lapses at its expiry."""
        with self._lock:
            token = self._leases.pop(scope, None)
            if token is None:
                return
            row = (
                None
                if backoff is None
                else (backoff.until, backoff.step, backoff.reason, backoff.source)
            )
            host.release_lease(self._conn, scope, token, row)
        if row is not None:
            self._word.bump()

    def peek(self, now: float) -> News | None:
        """The live backoffs and the kill switches, when another process wrote one of them (or an
        approval decision) since the last peek; None otherwise — a `pread` of the change word."""
        if self._path == ":memory:" or not self._word.changed():
            return None
        with self._lock:
            switches = {lane for (lane,) in self._conn.execute("SELECT lane FROM switch")}
        return News(backoffs=self.backoffs(now), switches=switches)

    def put_approval(self, approval: ApprovalRecord, now: float) -> None:
        with self._lock:
            host.put_approval(self._conn, host.approval_row(approval), now)

    def approvals(self, now: float) -> list[ApprovalRecord]:
        with self._lock:
            rows = host.approvals(self._conn, now)
        return [r for row in rows if (r := host.approval_from(row)) is not None]

    def decide_approval(
        self, approval_id: str, decision: str, now: float, once_until: float | None = None
    ) -> ApprovalRecord | None:
        """Decide a pending approval once, atomically across processes; the approval as decided,
        or None when it is unknown, expired or decided already. A "once" with `once_until` keeps
        its `OnceConsent` in the same transaction, so a process that sees the decision finds it."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                row = host.decide_approval(self._conn, approval_id, decision, now)
                decided = None if row is None else host.approval_from(row)
                if decided is not None and decision == "once" and once_until is not None:
                    _insert_once(self._conn, once_of(decided, once_until))
                self._conn.execute("COMMIT")
            finally:  # whatever happened, the transaction does not outlive the call
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
        if row is None:
            return None
        self._word.bump()
        return decided

    def listen(self, timeout_s: float) -> list[dict[str, Any]]:
        return []  # the processes sharing a file look at the change word (`peek`) instead

    def _check_file(self) -> None:
        """Raise `StoreUnavailable` while the file this process opened is not the one at the path
        (deleted or replaced) or has not been reseeded since: paid stays closed meanwhile."""
        moved = self._moved()
        if moved:
            self.up = False
            self.lost_reason = moved
        if not self.up:
            raise StoreUnavailable(
                f"{self.lost_reason or 'the state file changed'} ({self.where}); paid fallback "
                "closed until it is reopened"
            )

    def begin_sync(self, now: float) -> bool:
        """True when the file at the path is not the one this process opened (deleted, or replaced
        by another process's new file) or not yet reseeded: it is opened again — created when
        missing — and the caller passes its view to `reseed`."""
        day = window_id("day", now)
        with self._lock:
            self._own = {r: row for r, row in self._own.items() if row[0] >= day - 1}
        moved = self._moved()
        if not moved and self.up:
            return False
        if moved:
            self.up = False
            self.lost_reason = moved
            with self._lock:
                self._conn.close()  # the old file's last writes go with it, into our view
                self._conn = reopen(self._path, _FULL_SCHEMA, _migrate)
                self._identity = identity(self._path)
                self._db = None
                self._word.close()
                self._word = host.ChangeWord(f"{self._path}-changes")
        return True

    def reseed(self, view: LocalView, now: float) -> None:
        """Write this process's view into a file that lost it: counts and spend by maximum, backoffs
        by the later deadline, its own paid reservations, its kill switches; then reopen paid."""
        usage = [(*key, count) for key, count in view.usage]
        spend = [(lane, period, usd) for (lane, period), usd in view.spend.items()]
        with self._lock, self._conn:
            self._conn.executemany(
                "INSERT INTO usage (scope, dimension, window, window_id, count) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (scope, dimension, window, window_id) "
                "DO UPDATE SET count = MAX(count, excluded.count)",
                usage,
            )
            self._conn.executemany(
                "INSERT INTO spend (lane, period, usd) VALUES (?, ?, ?) "
                "ON CONFLICT (lane, period) DO UPDATE SET usd = MAX(usd, excluded.usd)",
                spend,
            )
            self._conn.executemany(
                "INSERT OR IGNORE INTO paid_ledger "
                "(id, day, reserved, lane, model, job, cohort, client, settled) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(r, *row) for r, row in self._own.items()],
            )
            self._conn.executemany(
                "INSERT OR IGNORE INTO switch (lane, at) VALUES (?, ?)",
                [(lane, now) for lane in view.switched_off],
            )
        self.put_backoffs({s: b for s, b in view.backoffs.items() if b.until > now}, now)
        self.put_snapshots(view.snapshots)
        if view.operator is not None:
            with self._lock:
                if host.operator_of(self._conn) is None:  # what the lost file held, kept
                    host.set_operator(self._conn, view.operator)
        self.up = True

    @property
    def host_id(self) -> str:
        return self._process

    def heartbeat(self, beat: terms.Beat) -> terms.Pulse:
        """This process's beat, stamped with the host's clock (`beat.now`); the store's terms."""
        with self._lock:
            return host.beat(self._conn, beat)

    def set_terms(self, operator: terms.Operator) -> None:
        with self._lock:
            host.set_operator(self._conn, operator)

    def withdraw(self) -> None:
        """Leave: this process's announcement holds no one back any more."""
        with self._lock, self._conn:
            self._conn.execute("DELETE FROM host_beat WHERE host = ?", (self._process,))

    def flush(self) -> None:
        pass

    def query(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._conn.execute(sql, args).fetchall()

    def close(self) -> None:
        with self._lock:
            self._conn.close()
            self._word.close()


def once_of(approval: ApprovalRecord, until: float) -> OnceConsent:
    """The "approve once" an approval's decision keeps: its request, model and worst case."""
    return OnceConsent(
        id=approval.id,
        client=approval.client,
        fingerprint=approval.fingerprint,
        candidate=approval.candidate,
        until=until,
        cost_usd=approval.estimated_cost_usd,
    )


def _insert_once(conn: sqlite3.Connection, once: OnceConsent) -> None:
    conn.execute(
        "INSERT OR REPLACE INTO once_consent "
        "(id, client, fingerprint, candidate, until, cost_usd) VALUES (?, ?, ?, ?, ?, ?)",
        (once.id, once.client, once.fingerprint, once.candidate, once.until, once.cost_usd),
    )


def backoff_fields(backoff: Backoff) -> dict[str, Any]:
    """A backoff as stored and published (short keys: it travels in every message)."""
    return {"u": backoff.until, "s": backoff.step, "r": backoff.reason, "o": backoff.source}


def backoff_from(data: dict[str, Any]) -> Backoff:
    """The inverse of `backoff_fields`; KeyError / TypeError / ValueError for a record we can not
    read (a deadline out of bounds included: see `Backoff`)."""
    reason, source = data["r"], data["o"]
    if reason not in LADDERS or not isinstance(source, str):
        raise ValueError("not a backoff record")
    try:
        until, step = float(data["u"]), int(data["s"])
    except OverflowError as exc:  # an integer too large for a float, an infinite step
        raise ValueError("not a backoff record") from exc
    return Backoff(until=until, step=step, reason=reason, source=source[:80])


def _snapshot_data(snapshot: RateLimitSnapshot) -> dict[str, Any]:
    return {
        "windows": [
            [w.dimension, w.window_s, w.limit, w.remaining, w.reset_s] for w in snapshot.windows
        ],
        "retry_after_s": snapshot.retry_after_s,
    }


def _snapshot_from(data: dict[str, Any]) -> RateLimitSnapshot:
    windows = tuple(
        Window(dimension=d, window_s=ws, limit=lim, remaining=rem, reset_s=rs)
        for d, ws, lim, rem, rs in data["windows"]
    )
    requests = next((w for w in windows if w.dimension == "requests"), None)
    tokens = next((w for w in windows if w.dimension == "tokens"), None)
    return RateLimitSnapshot(
        requests_remaining=requests.remaining if requests else None,
        requests_limit=requests.limit if requests else None,
        tokens_remaining=tokens.remaining if tokens else None,
        tokens_limit=tokens.limit if tokens else None,
        reset_requests_s=requests.reset_s if requests else None,
        reset_tokens_s=tokens.reset_s if tokens else None,
        retry_after_s=data.get("retry_after_s"),
        windows=windows,
    )

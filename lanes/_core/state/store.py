"""Shared state behind one `Store`: the union of one small protocol per concern, each defined — its
SQLite half and its Redis half side by side — in its own module:

| protocol | what | module |
| --- | --- | --- |
| `Backend`, `Syncing` | which store, how a call reaches it; the sync's plumbing | `backend.py` |
| `FreeTierMemory` | usage, credit spend, backoffs, header snapshots | `memory.py` |
| `PaidLedger` | paid reservations under the ceiling, settlements | `paid.py` |
| `Approvals` | pending approvals, their decisions, "approve once" | `approvals.py` |
| `Grants` | clients allowed paid fallback, until when | `grants.py` |
| `ProbeLeases` | one probe per cold scope for everyone | `leases.py` |
| `Switches` | the runtime kill switch, the canary's quarantine | `switches.py` |
| `SharedTerms` | the beats, the store's terms, an operator's | `beats.py` |

This host's own records (the audit, the canary's answers) are not shared: `store.records` is its
SQLite file's `LocalRecords` (`records.py`).

`SQLiteStore` (here) shares the state between the processes of one host; `RedisStore`
(`redis_store.py`, selected by `state = "redis://…"`) between hosts.

One SQLite file (WAL) per host is shared by every process that opens it — the sidecar and the jobs
that import the dispatcher — so their backoffs and counts coordinate. Times are wall-clock epoch
seconds. Each call is one short transaction (WAL, synchronous=NORMAL: durable across a process
crash, no fsync per commit); usage and spend are flushed every half second, so a crash loses at most
that much counting.
"""

from __future__ import annotations

import sqlite3
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import trio

from lanes._core.state import (
    approvals,
    audit_tables,
    beats,
    grants,
    leases,
    memory,
    paid,
    records,
    switches,
)
from lanes._core.state.approvals import ApprovalRecord as ApprovalRecord
from lanes._core.state.approvals import Approvals, SQLiteApprovals
from lanes._core.state.approvals import OnceConsent as OnceConsent
from lanes._core.state.approvals import once_of as once_of
from lanes._core.state.backend import STORE_ERRORS as STORE_ERRORS
from lanes._core.state.backend import Backend, News, Syncing
from lanes._core.state.backend import ClockRefused as ClockRefused
from lanes._core.state.backend import LocalView as LocalView
from lanes._core.state.backend import StoreUnavailable as StoreUnavailable
from lanes._core.state.backend import call as call
from lanes._core.state.backend import job_deadline as job_deadline
from lanes._core.state.beats import SharedTerms, SQLiteBeats
from lanes._core.state.change_word import ChangeWord
from lanes._core.state.grants import Grants, SQLiteGrants
from lanes._core.state.leases import ProbeLeases, SQLiteLeases
from lanes._core.state.memory import FreeTierMemory
from lanes._core.state.memory import UsageKey as UsageKey
from lanes._core.state.memory import backoff_fields as backoff_fields
from lanes._core.state.memory import backoff_from as backoff_from
from lanes._core.state.paid import PaidLedger, SQLitePaid
from lanes._core.state.records import LocalRecords
from lanes._core.state.sqlite_file import connect, identity, reopen
from lanes._core.state.switches import SQLiteSwitches, Switches

SCHEMA = "".join(
    m.SCHEMA
    for m in (memory, paid, approvals, grants, leases, switches, beats, audit_tables, records)
)
#: Columns added since the first release of each table, for `_migrate`.
_ADDED: dict[str, tuple[tuple[str, str], ...]] = {
    "paid_ledger": (("client", "TEXT"),),
    "once_consent": (("cost_usd", "FLOAT"),),  # NULL in an older file's onces: they never match
    "audit": audit_tables.ADDED,
    "audit_attempt": audit_tables.ATTEMPT_ADDED,
    "audit_jobs_hourly": audit_tables.HOURLY_ADDED,
}


class Store(
    Backend,
    Syncing,
    FreeTierMemory,
    PaidLedger,
    Approvals,
    Grants,
    ProbeLeases,
    Switches,
    SharedTerms,
    Protocol,
):
    """The whole store, for code that holds it (the dispatcher, the sync); code that uses one
    concern takes that concern's protocol. Reads on the hot path come from local caches; `call()`
    runs the rest (inline for SQLite, in a worker thread for Redis)."""

    @property
    def records(self) -> LocalRecords: ...  # this host's audit and canary answers


def _migrate(conn: sqlite3.Connection) -> None:
    """Give a file made by an older version the columns this one writes and reads."""
    for table, columns in _ADDED.items():
        have = {row[1] for row in conn.execute(f'PRAGMA table_info("{table}")')}
        for name, kind in columns:
            if name not in have:
                conn.execute(f'ALTER TABLE "{table}" ADD COLUMN {name} {kind}')
    conn.execute("CREATE INDEX IF NOT EXISTS idx_paid_ledger_client ON paid_ledger (day, client)")
    paid.migrate(conn)  # after the columns: the totals are per client


class SQLiteStore(
    SQLitePaid, SQLiteApprovals, SQLiteGrants, SQLiteLeases, SQLiteSwitches, SQLiteBeats
):
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

    def __init__(
        self,
        path: str,
        *,
        records: Callable[[sqlite3.Connection, threading.Lock], LocalRecords] = LocalRecords,
    ) -> None:
        """`records` makes this host's records over the file (a replay keeps them in memory)."""
        self.where = path
        self._path = path if path == ":memory:" else str(Path(path).expanduser())
        self._conn = connect(self._path, SCHEMA, _migrate)
        self._identity = identity(self._path) if self._path != ":memory:" else None
        self._lock = threading.Lock()
        self.records = records(self._conn, self._lock)
        self.up = True
        self.lost_reason = ""
        self._own = {}
        self._process = uuid.uuid4().hex[:12]
        self._leases = {}
        self._word = ChangeWord(None if path == ":memory:" else f"{self._path}-changes")

    def peek(self, now: float) -> News | None:
        """The live backoffs and the kill switches, when another process wrote one of them (or an
        approval decision) since the last peek; None otherwise — a `pread` of the change word."""
        if self._path == ":memory:" or not self._word.changed():
            return None
        switched = self.switches()
        return News(backoffs=self.backoffs(now), switches=switched)

    def listen(self, timeout_s: float) -> list[dict[str, Any]]:
        return []  # the processes sharing a file look at the change word (`peek`) instead

    def begin_sync(self, now: float) -> bool:
        """True when the file at the path is not the one this process opened (deleted, or replaced
        by another process's new file) or not yet reseeded: it is opened again — created when
        missing — and the caller passes its view to `reseed`."""
        self._forget_own(now)
        moved = self._moved()
        if not moved and self.up:
            return False
        if moved:
            self.up = False
            self.lost_reason = moved
            with self._lock:
                self._conn.close()  # the old file's last writes go with it, into our view
                self._conn = reopen(self._path, SCHEMA, _migrate)
                self._identity = identity(self._path)
                self.records.reopened(self._conn)
                self._word.close()
                self._word = ChangeWord(f"{self._path}-changes")
        return True

    def reseed(self, view: LocalView, now: float) -> None:
        """Write this process's view into a file that lost it: counts and spend by maximum, backoffs
        by the later deadline, its own paid reservations, its kill switches, what an operator set;
        then reopen paid."""
        with self._lock, self._conn:
            self._reseed_counts(view)
            self._reseed_paid()
            self._reseed_switches(view, now)
        self.put_backoffs({s: b for s, b in view.backoffs.items() if b.until > now}, now)
        self.put_snapshots(view.snapshots)
        self._reseed_terms(view.operator)
        self.up = True

    def flush(self) -> None:
        pass  # every write was one transaction already

    def close(self) -> None:
        with self._lock:
            self._conn.close()
            self._word.close()

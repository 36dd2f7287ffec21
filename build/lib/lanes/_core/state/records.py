"""This host's own records in its SQLite file: the audit (`audit_tables.py`) and the canary's
answers. They are not coordination — no other host reads them, and no backend but the file holds
them — so they have no protocol: a store hands out its file's `LocalRecords` (`store.records`),
and reports, the admin pages and the canary read and write through it.
"""

from __future__ import annotations

import sqlite3
import threading
from typing import Any

from lanes._core.state import audit_tables

#: This host's own paid reservations in a shared store (part of the file's schema, `store.py`).
SCHEMA = "CREATE TABLE IF NOT EXISTS own_paid (id TEXT PRIMARY KEY, day INTEGER, usd FLOAT);\n"


class LocalRecords:
    """The audit and the canary's tables of one SQLite file, over the connection (and lock) of the
    store that opened it; and, for a shared store, this host's own paid reservations."""

    def __init__(self, conn: sqlite3.Connection, lock: threading.Lock) -> None:
        self._conn = conn
        self._lock = lock
        self._db: Any = None

    def reopened(self, conn: sqlite3.Connection) -> None:
        """The store opened its file again (it was deleted or replaced): follow it there."""
        self._conn = conn
        self._db = None

    def keep_reservations(self, kept: dict[str, tuple[int, float]], since_day: int) -> None:
        """This host's paid reservations in a shared store (id → (day, what it counts now)), so
        that it can put them back into a store that lost them — after its own restart too; days
        before `since_day` are dropped."""
        with self._lock, self._conn:
            self._conn.execute("DELETE FROM own_paid WHERE day < ?", (since_day,))
            self._conn.executemany(
                "INSERT OR REPLACE INTO own_paid (id, day, usd) VALUES (?, ?, ?)",
                [(r, day, usd) for r, (day, usd) in kept.items()],
            )

    def reservations(self, since_day: int) -> dict[str, tuple[int, float]]:
        """What `keep_reservations` kept of `since_day` and after."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT id, day, usd FROM own_paid WHERE day >= ?", (since_day,)
            ).fetchall()
        return {str(r): (int(day), float(usd)) for r, day, usd in rows}

    @property
    def db(self) -> Any:
        """A sqlite-utils view of the same connection, for tables that grow (audit, canary).

        Imported on first use: it is a fifth of the sidecar's import time, and `/health` must
        answer within a second of launch."""
        if self._db is None:
            import sqlite_utils

            self._db = sqlite_utils.Database(self._conn)
        return self._db

    def query(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """The rows of one SQL statement over this host's file (reports read the audit so)."""
        with self._lock:
            return self._conn.execute(sql, args).fetchall()

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

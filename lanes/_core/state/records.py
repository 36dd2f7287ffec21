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


class LocalRecords:
    """The audit and the canary's tables of one SQLite file, over the connection (and lock) of the
    store that opened it."""

    def __init__(self, conn: sqlite3.Connection, lock: threading.Lock) -> None:
        self._conn = conn
        self._lock = lock
        self._db: Any = None

    def reopened(self, conn: sqlite3.Connection) -> None:
        """The store opened its file again (it was deleted or replaced): follow it there."""
        self._conn = conn
        self._db = None

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

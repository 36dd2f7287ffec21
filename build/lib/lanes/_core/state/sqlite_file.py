"""Opening the SQLite state file: safe when several processes create it at the same moment, and
recognisable afterwards, so a file deleted or replaced under a running process is noticed.

Creating a file, switching it to WAL and creating the tables take locks that a second process
opening the same new file at the same instant may hold: switching the journal mode does not wait
on SQLite's busy handler, so it is retried (briefly, with jitter) until `OPEN_WITHIN_S`; the tables
are created in one `BEGIN IMMEDIATE` transaction, so two processes never interleave them.
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path

OPEN_WITHIN_S = 10.0  # how long a first open may wait for other processes opening the same file
BUSY_TIMEOUT_S = 0.25  # afterwards: how long one statement waits for another process's lock

#: (device, inode): what the path pointed at when the file was opened; None when it is gone.
Identity = tuple[int, int] | None


def identity(path: str) -> Identity:
    """The file's (device, inode), or None when nothing is at `path` now."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


#: Brings a file made by an older version up to date; runs inside the schema's transaction.
Migrate = Callable[[sqlite3.Connection], None]


def connect(path: str, schema: str, migrate: Migrate | None = None) -> sqlite3.Connection:
    """Open (creating when missing) the state file at `path` — or `:memory:` — with the schema in
    place and `migrate` run. Raises `sqlite3.Error` when it can not be opened within
    `OPEN_WITHIN_S`.

    The connection is returned in Python's default transaction handling, so `with conn:` makes
    one transaction of what it holds (a batch is one commit, never one per row)."""
    if path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(
        path, check_same_thread=False, timeout=OPEN_WITHIN_S, isolation_level=None
    )
    try:
        _prepare(conn, path, schema, migrate)
    except BaseException:
        conn.close()
        raise
    conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
    conn.isolation_level = "DEFERRED"  # `with conn:` is one transaction again
    return conn


def reopen(path: str, schema: str, migrate: Migrate | None = None) -> sqlite3.Connection:
    """Open the file now at `path` after the one opened before was deleted or replaced. When nothing
    is there, the deleted file's write-ahead log and index are removed first: they belong to the
    old file, and a new file must not start from them."""
    if identity(path) is None:
        for suffix in ("-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
    return connect(path, schema, migrate)


@contextlib.contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One `BEGIN IMMEDIATE` transaction (it waits for the other writers, so what it reads stays
    true until it commits): committed when the block ends, rolled back when it raises — whatever
    happens, the transaction does not outlive the block."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")
    finally:
        if conn.in_transaction:
            conn.execute("ROLLBACK")


def _prepare(conn: sqlite3.Connection, path: str, schema: str, migrate: Migrate | None) -> None:
    give_up_at = time.monotonic() + OPEN_WITHIN_S  # wall-clock: a blocking open, before any job
    while True:
        try:
            if path != ":memory:":
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
            _create(conn, schema, migrate)
            return
        except sqlite3.OperationalError as exc:
            busy = "locked" in str(exc) or "busy" in str(exc)
            if not busy or time.monotonic() > give_up_at:  # wall-clock: as above
                raise
        time.sleep(0.005 + 0.02 * random.random())  # wall-clock: another process holds the lock


def _create(conn: sqlite3.Connection, schema: str, migrate: Migrate | None) -> None:
    """Every statement of `schema`, then `migrate`, in one immediate transaction (it waits for
    other writers, so two processes never both add a column)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        for statement in schema.split(";"):
            if statement.strip():
                conn.execute(statement)
        if migrate is not None:
            migrate(conn)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise

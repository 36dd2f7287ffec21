"""Where the response cache keeps its entries: `SQLiteEntries`, a SQLite file of its own beside the
SQLite state (the processes of one host share it; `:memory:` keeps it in this process), and
`RedisEntries` (`redis_entries.py`) in the Redis state store, for every host of a deployment.

Both keep, per entry, who asked (the client), when it was made, what it cost and who served it,
and the answer's bytes; entries past their TTL are never served, and the stored bytes stay under
the cap by evicting the oldest first. Blocking: the writer calls them from a worker thread; a read
of SQLite is one primary-key look-up, made inline.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path
from typing import Any, Protocol

import attrs

from lanes._core.state.sqlite_file import connect, immediate

SCHEMA = """
CREATE TABLE IF NOT EXISTS cache_entry (
    key TEXT PRIMARY KEY, client TEXT NOT NULL, made_at FLOAT NOT NULL, size INTEGER NOT NULL,
    lane TEXT, model TEXT, provider TEXT, route TEXT, cost_usd FLOAT, body BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS idx_cache_made ON cache_entry (made_at);
CREATE INDEX IF NOT EXISTS idx_cache_client ON cache_entry (client);
CREATE TABLE IF NOT EXISTS cache_total (one INTEGER PRIMARY KEY CHECK (one = 1), bytes INTEGER);
"""
#: What keeps `cache_total` the stored bytes, one statement each (a trigger holds a `;`, which the
#: schema's splitter would cut at).
TRIGGERS = (
    "INSERT OR IGNORE INTO cache_total VALUES (1, 0)",
    "CREATE TRIGGER IF NOT EXISTS cache_added AFTER INSERT ON cache_entry BEGIN "
    "UPDATE cache_total SET bytes = bytes + NEW.size; END",
    "CREATE TRIGGER IF NOT EXISTS cache_replaced AFTER UPDATE OF size ON cache_entry BEGIN "
    "UPDATE cache_total SET bytes = bytes + NEW.size - OLD.size; END",
    "CREATE TRIGGER IF NOT EXISTS cache_gone AFTER DELETE ON cache_entry BEGIN "
    "UPDATE cache_total SET bytes = bytes - OLD.size; END",
)
#: The most entries one write evicts: after `max_mb` is lowered, the excess goes over the next
#: writes, none of which holds the store (or, inline, the event loop) long.
EVICT_AT_MOST = 256
#: One entry written, or written over (the triggers keep `cache_total`).
_UPSERT = (
    "INSERT INTO cache_entry VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (key) DO UPDATE "
    "SET client = excluded.client, made_at = excluded.made_at, size = excluded.size, "
    "lane = excluded.lane, model = excluded.model, provider = excluded.provider, "
    "route = excluded.route, cost_usd = excluded.cost_usd, body = excluded.body"
)


@attrs.frozen(kw_only=True)
class Entry:
    """One stored answer: the chat completion's JSON bytes, and what it was made with."""

    key: str
    client: str
    made_at: float  # wall-clock epoch seconds
    body: bytes = attrs.field(repr=False)
    lane: str
    model: str
    provider: str
    route: str
    cost_usd: float = 0.0

    @property
    def size(self) -> int:
        return len(self.body)


class Entries(Protocol):
    """The entries' store. `get` returns an entry younger than `ttl_s` (else None); `put` stores
    some (in one transaction where the store has them) and evicts the oldest while the stored
    bytes are over `max_bytes`, `EVICT_AT_MOST` at most (an entry older than `ttl_s` is never
    served); `expire` deletes at
    most `limit` of those made at or before `before`, the oldest first, and says how many; `clear`
    deletes a client's entries (every one for None) and says how many; `sizes` is (entries,
    bytes); `memory_note` says how entries of `max_bytes` in all may crowd out the state store's
    own keys where the store shares its memory with them ("" when they can not)."""

    where: str

    def get(self, key: str, now: float, ttl_s: float) -> Entry | None: ...
    def put(self, entries: list[Entry], max_bytes: int, ttl_s: float) -> None: ...
    def expire(self, before: float, limit: int) -> int: ...
    def clear(self, client: str | None) -> int: ...
    def sizes(self) -> tuple[int, int]: ...
    def memory_note(self, max_bytes: int) -> str: ...
    def close(self) -> None: ...


def cache_path(state: str) -> str:
    """The SQLite cache file beside a SQLite `state` file (`:memory:` beside `:memory:`)."""
    return ":memory:" if state == ":memory:" else str(Path(state).expanduser()) + ".cache"


def _private(path: str) -> None:
    """The file made its owner's alone before SQLite opens it: it holds answers."""
    if path == ":memory:":
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
    for mine in (Path(path), *Path(path).parent.glob(Path(path).name + "-*")):
        if mine.stat().st_uid == os.getuid():
            mine.chmod(0o600)


def _row(entry: Entry) -> tuple[Any, ...]:
    return (
        entry.key,
        entry.client,
        entry.made_at,
        entry.size,
        entry.lane,
        entry.model,
        entry.provider,
        entry.route,
        entry.cost_usd,
        entry.body,
    )


class SQLiteEntries:
    def __init__(self, path: str) -> None:
        self.where = path
        _private(path)
        self._conn = connect(path, SCHEMA)
        self._lock = threading.Lock()
        with self._lock, immediate(self._conn) as conn:
            for statement in TRIGGERS:
                conn.execute(statement)

    def get(self, key: str, now: float, ttl_s: float) -> Entry | None:
        with self._lock:
            row = self._conn.execute(
                "SELECT client, made_at, body, lane, model, provider, route, cost_usd "
                "FROM cache_entry WHERE key = ? AND made_at > ?",
                (key, now - ttl_s),
            ).fetchone()
        if row is None:
            return None
        client, made_at, body, lane, model, provider, route, cost = row
        return Entry(
            key=key,
            client=client,
            made_at=made_at,
            body=bytes(body),
            lane=lane,
            model=model,
            provider=provider,
            route=route,
            cost_usd=cost or 0.0,
        )

    def put(self, entries: list[Entry], max_bytes: int, ttl_s: float) -> None:
        """(`ttl_s`: a row past it is never read, and goes with the oldest.)"""
        with self._lock, immediate(self._conn) as conn:
            conn.executemany(_UPSERT, [_row(entry) for entry in entries])
            for _ in range(EVICT_AT_MOST):
                if self._total(conn) <= max_bytes:
                    break
                oldest = conn.execute("SELECT key FROM cache_entry ORDER BY made_at LIMIT 1")
                row = oldest.fetchone()
                if row is None:
                    break
                conn.execute("DELETE FROM cache_entry WHERE key = ?", row)

    @staticmethod
    def _total(conn: sqlite3.Connection) -> int:
        total: int = conn.execute("SELECT bytes FROM cache_total").fetchone()[0]
        return total

    def expire(self, before: float, limit: int) -> int:
        with self._lock, immediate(self._conn) as conn:
            gone = conn.execute(
                "DELETE FROM cache_entry WHERE key IN (SELECT key FROM cache_entry "
                "WHERE made_at <= ? ORDER BY made_at LIMIT ?)",
                (before, limit),
            ).rowcount
        return int(gone)

    def clear(self, client: str | None) -> int:
        with self._lock, immediate(self._conn) as conn:
            where, args = ("WHERE client = ?", (client,)) if client is not None else ("", ())
            gone = conn.execute(f"DELETE FROM cache_entry {where}", args).rowcount
        return int(gone)

    def sizes(self) -> tuple[int, int]:
        with self._lock:
            count = self._conn.execute("SELECT COUNT(*) FROM cache_entry").fetchone()[0]
            total = self._total(self._conn)
        return int(count), total

    def memory_note(self, max_bytes: int) -> str:
        """A file grows on disk as it must: nothing to say of its memory."""
        return ""

    def close(self) -> None:
        with self._lock:
            self._conn.close()

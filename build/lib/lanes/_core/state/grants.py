"""Grants: a client allowed paid fallback until a time, shared by every process (or host).

The rule, on both backends: the write made last wins (a past `until` revokes), so a revocation
sticks. SQLite: rows of `"grant"`, read live. Redis: a hash of "until@at" (`lanes:grant`), read
into this host's cache at every sync, written and published at the next flush — the write with
the later `at` (epoch seconds) wins on every host, however the flushes and events interleave.
"""

from __future__ import annotations

from typing import Any, Protocol

from lanes._core.state.backend import RedisBase, SQLiteBase, text

SCHEMA = """
CREATE TABLE IF NOT EXISTS "grant" (client TEXT PRIMARY KEY, until FLOAT);
"""


class Grants(Protocol):
    """Which clients may use paid fallback, until when (epoch seconds)."""

    def put_grant(self, client: str, until: float, at: float) -> None: ...
    def grant_until(self, client: str) -> float | None: ...
    def grants(self, now: float) -> dict[str, float]: ...


class SQLiteGrants(SQLiteBase):
    """Grants in the host's SQLite file."""

    def put_grant(self, client: str, until: float, at: float) -> None:
        """Grant `client` paid fallback until `until` (a past `until` revokes it); the last write
        wins."""
        with self._lock, self._conn:
            self._conn.execute(
                'INSERT OR REPLACE INTO "grant" (client, until) VALUES (?, ?)', (client, until)
            )

    def grant_until(self, client: str) -> float | None:
        with self._lock:
            row = self._conn.execute(
                'SELECT until FROM "grant" WHERE client = ?', (client,)
            ).fetchone()
        return row[0] if row else None

    def grants(self, now: float) -> dict[str, float]:
        """Every client's grant in force at `now`: client → until."""
        with self._lock:
            rows = self._conn.execute('SELECT client, until FROM "grant" WHERE until > ?', (now,))
            return {client: float(until) for client, until in rows}


def _grant(value: object) -> tuple[float, float]:
    """A grant as kept in Redis: "until@at" (an older "until" alone reads as written at 0)."""
    until, _, at = text(value).partition("@")
    return float(until), float(at or 0.0)


class RedisGrants(RedisBase):
    """Grants in Redis, answered from this host's cache."""

    _grants: dict[str, tuple[float, float]]  # client → (until, written at)
    _grant_writes: dict[str, tuple[float, float]]  # this host's, waiting for the next flush

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

    def _take_grants(self, stored: dict[Any, Any]) -> None:
        """The grants the sync read, under this host's unflushed writes (newer). Hold the lock."""
        merged = {text(client): _grant(value) for client, value in stored.items()}
        for client, written in self._grant_writes.items():
            if written[1] >= merged.get(client, (0.0, 0.0))[1]:
                merged[client] = written
        self._grants = merged

    def _heard_grant(self, event: dict[str, Any]) -> None:
        """Another host's grant, published: kept unless ours was written later."""
        heard = (float(event["until"]), float(event.get("at", 0.0)))
        with self._lock:
            if heard[1] >= self._grants.get(event["client"], (0.0, 0.0))[1]:
                self._grants[event["client"]] = heard

    def _queue_grants(self, pipe: Any, grants: dict[str, tuple[float, float]]) -> None:
        for client, (until, at) in grants.items():
            pipe.hset(self._k("grant"), client, f"{until!r}@{at!r}")
            pipe.publish(self._channel, self._message("grant", client=client, until=until, at=at))

    def _reseed_grants(self) -> None:
        """Every grant this host knows, written again at the next flush — revocations too: they
        are newer. Hold the lock."""
        for client, grant in self._grants.items():
            self._grant_writes.setdefault(client, grant)

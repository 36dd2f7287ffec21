"""Probe leases: a cold or reopened scope is probed by one process of the host (SQLite) or one host
of the fleet (Redis), so a closed door gets one knock rather than one per process.

The rules, on both backends, each one atomic step:

- a lease is taken only while no one else's is unexpired and the scope's backoff is not in force
  (then the backoff is the answer: the door is known closed);
- a process (host) never waits on its own lease: one it holds is taken over, under a new token;
- it is released only under the token it was taken with, together with the backoff the probe
  caused, written *first* — so no one can take the lease before the closed door is on record;
- a holder that dies is released by the expiry.

SQLite: a row of `probe_lease` (scope, token, expiry in epoch seconds — the host's wall, passed
in), taken and released in `BEGIN IMMEDIATE` transactions; a process waiting on another's asks
again every `lease_poll_s`. Redis: a key with a TTL on the server's clock (`LEASE`: SET PX),
released by `RELEASE` at the next flush, which publishes the probe's answer: no one polls.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from typing import Any, Protocol

from lanes._core.freetier.backoff import Backoff
from lanes._core.state.backend import guarded
from lanes._core.state.memory import (
    PUT_BACKOFF,
    RedisMemory,
    SQLiteMemory,
    backoff_from,
    backoff_row,
)
from lanes._core.state.redis_scripts import LEASE, RELEASE
from lanes._core.state.sqlite_file import immediate

SCHEMA = """
CREATE TABLE IF NOT EXISTS probe_lease (scope TEXT PRIMARY KEY, token TEXT, until FLOAT);
"""


class ProbeLeases(Protocol):
    """The right to probe a scope for everyone sharing the store."""

    # how often a job waiting on another process's probe asks again (inf: it is told, by events)
    @property
    def lease_poll_s(self) -> float: ...
    def probe_lease(self, scope: str, ttl_s: float, now: float | None = None) -> bool | Backoff: ...
    def probe_done(self, scope: str, ok: bool, backoff: Backoff | None = None) -> None: ...


class SQLiteLeases(SQLiteMemory):
    """Leases in the host's SQLite file (the backoffs they answer with are its `backoff` rows)."""

    lease_poll_s = 0.02  # a job waiting on another process's probe looks again this often
    _leases: dict[str, str]  # scope → the token of the lease this process holds

    def probe_lease(self, scope: str, ttl_s: float, now: float | None = None) -> bool | Backoff:
        """Take the right to probe a cold or reopened scope for every process sharing the file, for
        `ttl_s` from `now` (epoch seconds): True when taken, False while another process holds it,
        the scope's backoff when one is in force. In memory there is no one else: always True."""
        if self._path == ":memory:":
            return True
        now = time.time() if now is None else now  # wall-clock: shared with other processes
        token = f"{self._process}:{uuid.uuid4().hex[:8]}"
        mine = f"{self._process}:"
        with self._lock:
            with immediate(self._conn) as conn:
                backoff = conn.execute(
                    "SELECT until, step, reason, source FROM backoff WHERE scope = ? AND until > ?",
                    (scope, now),
                ).fetchone()
                if backoff is not None:
                    return backoff_row(tuple(backoff))
                held = conn.execute(
                    "SELECT token FROM probe_lease WHERE scope = ? AND until > ?", (scope, now)
                ).fetchone()
                if held is not None and not str(held[0]).startswith(mine):
                    return False
                conn.execute(
                    "INSERT OR REPLACE INTO probe_lease (scope, token, until) VALUES (?, ?, ?)",
                    (scope, token, now + ttl_s),
                )
            self._leases[scope] = token
        return True

    def probe_done(self, scope: str, ok: bool, backoff: Backoff | None = None) -> None:
        """Release this process's lease of `scope` (if it holds one) together with the backoff the
        probe caused, written first — one transaction. Raises `sqlite3.Error` when the file is busy
        past its timeout: the lease then lapses at its expiry."""
        with self._lock:
            token = self._leases.pop(scope, None)
            if token is None:
                return
            with immediate(self._conn) as conn:
                if backoff is not None:
                    conn.execute(
                        PUT_BACKOFF,
                        (scope, backoff.until, backoff.step, backoff.reason, backoff.source),
                    )
                conn.execute(
                    "DELETE FROM probe_lease WHERE scope = ? AND token = ?", (scope, token)
                )
        if backoff is not None:
            self._word.bump()


class RedisLeases(RedisMemory):
    """Leases in Redis, shared by every host (the backoffs they answer with are its keys)."""

    lease_poll_s = math.inf  # a probe's answer is published: no one asks again meanwhile
    _leases: dict[str, str]  # scope → the token of the lease this host holds
    _releases: list[tuple[str, bool, Backoff | None, str]]  # waiting for the next flush

    @guarded
    def probe_lease(self, scope: str, ttl_s: float, now: float | None = None) -> bool | Backoff:
        """Take the right to probe a cold or reopened scope for every host (expires after `ttl_s`,
        on Redis's clock: `now` is not needed): True when taken, False when another host holds it,
        the scope's backoff when one is in force."""
        token = f"{self._host}:{uuid.uuid4().hex[:8]}"
        outcome, value = self._script(LEASE)(
            keys=[self._k("probe", scope), self._k("backoff", scope)],
            args=[token, max(1, int(min(ttl_s, 3600.0) * 1000)), f"{self._host}:"],
        )
        if outcome == 2:
            return backoff_from(json.loads(value))
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

    def _queue_releases(
        self, pipe: Any, releases: list[tuple[str, bool, Backoff | None, str]]
    ) -> None:
        for scope, ok, backoff, token in releases:
            if backoff is not None:
                self._queue_backoffs(pipe, {scope: backoff}, None)
            self._script(RELEASE)(
                keys=[self._k("probe", scope)],
                args=[token, self._channel, self._message("probe", scope=scope, ok=ok)],
                client=pipe,
            )

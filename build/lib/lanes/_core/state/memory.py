"""The free tier's memory, shared: usage counters per window, credit spend, backoffs and the latest
rate-limit header snapshot per scope.

The rules, on both backends: counts and spend add up across processes and hosts; a backoff keeps
the *later* deadline when two write one for a scope, and a past one is never reported; a reseed
keeps the larger count. SQLite: rows (`usage`, `spend`, `backoff`, `snapshot`). Redis: usage is a
hash per window (`lanes:usage:<window>:<id>`, HINCRBY, expiring at the window's end — UTC
minutes, days, months), spend a hash of running totals, a backoff a key that expires on its own
(`lanes:backoff:<scope>`, indexed by deadline in a sorted set) written by a script (`BACKOFF`)
that publishes the ones that won.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any, Protocol

from lanes._core.freetier.backoff import LADDERS, Backoff
from lanes._core.freetier.headers import RateLimitSnapshot, Window, snapshot_of
from lanes._core.freetier.windows import WINDOWS, Key, WindowName, end_of, window_id
from lanes._core.state.backend import SEP, LocalView, RedisBase, SQLiteBase, guarded, parsed, text
from lanes._core.state.redis_scripts import BACKOFF, MAX

UsageKey = Key  # (scope, dimension, window, window id)
SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    scope TEXT, dimension TEXT, window TEXT, window_id INTEGER, count INTEGER,
    PRIMARY KEY (scope, dimension, window, window_id));
CREATE TABLE IF NOT EXISTS spend (lane TEXT, period INTEGER, usd FLOAT, PRIMARY KEY (lane, period));
CREATE TABLE IF NOT EXISTS backoff (
    scope TEXT PRIMARY KEY, until FLOAT, step INTEGER, reason TEXT, source TEXT);
CREATE TABLE IF NOT EXISTS snapshot (scope TEXT PRIMARY KEY, at FLOAT, data TEXT);
"""
#: A backoff written unless the one there ends later (the probe lease's release writes it too).
PUT_BACKOFF = (
    "INSERT INTO backoff (scope, until, step, reason, source) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (scope) DO UPDATE SET until = excluded.until, step = excluded.step, "
    "reason = excluded.reason, source = excluded.source "
    "WHERE excluded.until > backoff.until"
)


class FreeTierMemory(Protocol):
    """Counts, spend, backoffs and header snapshots, shared by every process (or host)."""

    def add_usage(
        self, rows: list[tuple[UsageKey, int]], spend: dict[tuple[str, int], float]
    ) -> None: ...
    def usage_totals(self, now: float) -> list[tuple[UsageKey, int]]: ...
    def spend_totals(self) -> dict[tuple[str, int], float]: ...
    def put_backoffs(self, backoffs: dict[str, Backoff], now: float | None = None) -> None: ...
    def backoffs(self, now: float) -> list[tuple[str, Backoff]]: ...
    def put_snapshots(self, snapshots: dict[str, tuple[float, RateLimitSnapshot]]) -> None: ...
    def snapshots(self) -> dict[str, tuple[float, RateLimitSnapshot]]: ...


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


def backoff_row(row: tuple[Any, ...]) -> Backoff:
    """A `backoff` row's (until, step, reason, source) as a backoff; as `backoff_from` raises."""
    until, step, reason, source = row
    return backoff_from({"u": until, "s": step, "r": reason, "o": source})


def snapshot_data(snapshot: RateLimitSnapshot) -> dict[str, Any]:
    """A header snapshot as stored (JSON)."""
    return {
        "windows": [
            [w.dimension, w.window_s, w.limit, w.remaining, w.reset_s] for w in snapshot.windows
        ],
        "retry_after_s": snapshot.retry_after_s,
    }


def snapshot_from(data: dict[str, Any]) -> RateLimitSnapshot:
    """The inverse of `snapshot_data`; KeyError / TypeError / ValueError for one we can not read."""
    windows = tuple(
        Window(dimension=d, window_s=ws, limit=lim, remaining=rem, reset_s=rs)
        for d, ws, lim, rem, rs in data["windows"]
    )
    return snapshot_of(windows, retry_after_s=data.get("retry_after_s"))


class SQLiteMemory(SQLiteBase):
    """The free tier's memory in the host's SQLite file."""

    def add_usage(
        self, rows: list[tuple[UsageKey, int]], spend: dict[tuple[str, int], float]
    ) -> None:
        with self._lock, self._conn:
            _merge_counts(self._conn, rows, spend, "{0} + excluded.{0}")

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
                PUT_BACKOFF,
                [(scope, b.until, b.step, b.reason, b.source) for scope, b in backoffs.items()],
            )
        if backoffs:
            self._word.bump()  # the other processes look before their next attempt

    def backoffs(self, now: float) -> list[tuple[str, Backoff]]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT scope, until, step, reason, source FROM backoff WHERE until > ?", (now,)
            ).fetchall()
        return parsed(((scope, tuple(row)) for scope, *row in rows), backoff_row)

    def put_snapshots(self, snapshots: dict[str, tuple[float, RateLimitSnapshot]]) -> None:
        with self._lock, self._conn:
            self._conn.executemany(
                "INSERT OR REPLACE INTO snapshot (scope, at, data) VALUES (?, ?, ?)",
                [
                    (scope, at, json.dumps(snapshot_data(snap)))
                    for scope, (at, snap) in snapshots.items()
                ],
            )

    def snapshots(self) -> dict[str, tuple[float, RateLimitSnapshot]]:
        with self._lock:
            rows = self._conn.execute("SELECT scope, at, data FROM snapshot").fetchall()
        out = {}
        for scope, at, data in rows:
            try:
                out[scope] = (at, snapshot_from(json.loads(data)))
            except (ValueError, TypeError, KeyError):
                continue  # a row we can not read is skipped, never fatal
        return out

    def _reseed_counts(self, view: LocalView) -> None:
        """Counts and spend back by their maximum — inside the reseed's transaction."""
        _merge_counts(self._conn, view.usage, view.spend, "MAX({0}, excluded.{0})")


def _merge_counts(
    conn: sqlite3.Connection,
    usage: list[tuple[UsageKey, int]],
    spend: dict[tuple[str, int], float],
    merge: str,
) -> None:
    """Write usage counts and credit spend, each merged with the row there by `merge` (a template
    of the column: added, or the larger kept)."""
    conn.executemany(
        "INSERT INTO usage (scope, dimension, window, window_id, count) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT (scope, dimension, window, window_id) "
        f"DO UPDATE SET count = {merge.format('count')}",
        [(*key, count) for key, count in usage],
    )
    conn.executemany(
        "INSERT INTO spend (lane, period, usd) VALUES (?, ?, ?) "
        f"ON CONFLICT (lane, period) DO UPDATE SET usd = {merge.format('usd')}",
        [(lane, period, usd) for (lane, period), usd in spend.items()],
    )


class RedisMemory(RedisBase):
    """The free tier's memory in Redis, shared by every host."""

    @guarded
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

    @guarded
    def usage_totals(self, now: float) -> list[tuple[UsageKey, int]]:
        current = [(w, window_id(w, now)) for w in WINDOWS]
        pipe = self._redis.pipeline(transaction=False)
        for window, index in current:
            pipe.hgetall(self._k("usage", window, index))
        out: list[tuple[UsageKey, int]] = []
        for (window, index), fields in zip(current, pipe.execute(), strict=True):
            for field, count in fields.items():
                scope, _, dimension = text(field).rpartition(SEP)
                out.append(((scope, dimension, window, index), int(count)))
        return out

    @guarded
    def spend_totals(self) -> dict[tuple[str, int], float]:
        out: dict[tuple[str, int], float] = {}
        for field, usd in self._redis.hgetall(self._k("spend")).items():
            lane, _, period = text(field).rpartition(SEP)
            out[(lane, int(period))] = float(usd)
        return out

    @guarded
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
            message = self._message("backoff", scope=scope, **backoff_fields(b))
            self._script(BACKOFF)(
                keys=[self._k("backoff", scope), self._k("backoff-index")],
                args=[
                    scope,
                    repr(b.until),
                    str(int(b.until * 1000) + 1),
                    value,
                    self._channel,
                    message,
                    repr(floor),
                ],
                client=pipe,
            )

    @guarded
    def backoffs(self, now: float) -> list[tuple[str, Backoff]]:
        scopes = [
            text(s)
            for s in self._redis.zrangebyscore(self._k("backoff-index"), f"({now!r}", "+inf")
        ]
        if not scopes:
            return []
        values = self._redis.mget([self._k("backoff", s) for s in scopes])
        found = [(s, v) for s, v in zip(scopes, values, strict=True) if v is not None]  # or expired
        return parsed(found, lambda value: backoff_from(json.loads(value)))

    @guarded
    def put_snapshots(self, snapshots: dict[str, tuple[float, RateLimitSnapshot]]) -> None:
        if snapshots:
            self._redis.hset(
                self._k("snapshot"),
                mapping={
                    scope: json.dumps({"at": at, **snapshot_data(snap)})
                    for scope, (at, snap) in snapshots.items()
                },
            )

    @guarded
    def snapshots(self) -> dict[str, tuple[float, RateLimitSnapshot]]:
        out: dict[str, tuple[float, RateLimitSnapshot]] = {}
        for scope, value in self._redis.hgetall(self._k("snapshot")).items():
            try:
                data = json.loads(value)
                out[text(scope)] = (float(data["at"]), snapshot_from(data))
            except (ValueError, TypeError, KeyError):
                continue
        return out

    def _reseed_counts(self, pipe: Any, view: LocalView) -> None:
        """Counts and spend back by their maximum (`MAX`), queued on `pipe`."""
        by_window: dict[tuple[WindowName, int], list[str]] = {}
        for (scope, dimension, window, index), count in view.usage:
            by_window.setdefault((window, index), []).extend(
                [f"{scope}{SEP}{dimension}", str(count)]
            )
        for (window, index), pairs in by_window.items():
            self._script(MAX)(
                keys=[self._k("usage", window, index)],
                args=[int(end_of(window, index)) + 60, *pairs],
                client=pipe,
            )
        if view.spend:
            pairs = [
                v
                for (lane, period), usd in view.spend.items()
                for v in (f"{lane}{SEP}{period}", repr(usd))
            ]
            self._script(MAX)(keys=[self._k("spend")], args=[0, *pairs], client=pipe)

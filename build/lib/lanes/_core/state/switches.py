"""The runtime kill switch (`lanes lane off`) and the canary's quarantine, obeyed by every process
(or host) sharing the store.

The rules, on both backends: the last write of a lane's switch wins, and every process obeys it
from its next job on; a quarantine names its verdict and reason until released; both survive a
store that lost its data (this process's view is written back, without overwriting what is
there). SQLite: rows (`switch`, `quarantine`); a switch bumps the change word so the others look
before their next attempt. Redis: hashes (`lanes:switch`, `lanes:quarantine`); a switch is written
and published at the next flush, a quarantine at once when Redis answers — kept in the host's
local file and queued when it does not, the last view read standing meanwhile.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, Protocol

from lanes._core.state.backend import (
    LocalView,
    RedisBase,
    SQLiteBase,
    StoreUnavailable,
    guarded,
    parsed,
    text,
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS quarantine (key TEXT PRIMARY KEY, verdict TEXT, reason TEXT, at FLOAT);
CREATE TABLE IF NOT EXISTS switch (lane TEXT PRIMARY KEY, at FLOAT);
"""


class Switches(Protocol):
    """Lanes switched off at runtime; candidates ("lane/model") the canary took out of routing."""

    def put_switch(self, lane: str, off: bool, at: float) -> None: ...
    def switches(self) -> set[str]: ...
    def quarantined(self) -> dict[str, str]: ...
    def set_quarantine(
        self, key: str, verdict: str | None, reason: str = "", at: float = 0.0
    ) -> None: ...


def quarantine_reason(verdict: object, reason: object) -> str:
    """Why a candidate is out of routing, as every page and log line says it."""
    return f"quarantined by the canary ({verdict}: {reason})"


class SQLiteSwitches(SQLiteBase):
    """Switches and quarantine in the host's SQLite file."""

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

    def quarantined(self) -> dict[str, str]:
        """Candidates ("lane/model") the canary took out of routing, with the reason."""
        with self._lock:
            return {
                key: quarantine_reason(verdict, reason)
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

    def _reseed_switches(self, view: LocalView, now: float) -> None:
        """This process's switched-off lanes back — inside the reseed's transaction."""
        self._conn.executemany(
            "INSERT OR IGNORE INTO switch (lane, at) VALUES (?, ?)",
            [(lane, now) for lane in view.switched_off],
        )


def _quarantine_reason(value: str) -> str:
    """The reason of a quarantine as kept in Redis (JSON)."""
    data = json.loads(value)
    return quarantine_reason(data["verdict"], data["reason"])


class RedisSwitches(RedisBase):
    """Switches and quarantine in Redis, shared by every host."""

    _local: SQLiteSwitches  # this host's file: its quarantine stands while Redis is away
    _quarantine: dict[str, str]  # the last view read
    _switch_writes: dict[str, tuple[bool, float]]  # waiting for the next flush
    _quarantine_writes: dict[str, tuple[str | None, str, float]]

    def put_switch(self, lane: str, off: bool, at: float) -> None:
        with self._lock:
            self._switch_writes[lane] = (off, at)

    @guarded
    def switches(self) -> set[str]:
        off = {text(lane) for lane in self._redis.hkeys(self._k("switch"))}
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

    @guarded
    def _read_quarantine(self) -> dict[str, str]:
        stored = self._redis.hgetall(self._k("quarantine")).items()
        return dict(parsed(((text(k), v) for k, v in stored), _quarantine_reason))

    def set_quarantine(
        self, key: str, verdict: str | None, reason: str = "", at: float = 0.0
    ) -> None:
        """Write now when Redis answers; otherwise at the next sync that reaches it."""
        self._local.set_quarantine(key, verdict, reason, at)
        with self._lock:
            self._quarantine_writes[key] = (verdict, reason, at)
        with contextlib.suppress(StoreUnavailable):  # kept, and written by the next flush
            self._flush_quarantine()

    @guarded
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

    def _queue_switches(self, pipe: Any, switches: dict[str, tuple[bool, float]]) -> None:
        for lane, (off, at) in switches.items():
            if off:
                pipe.hset(self._k("switch"), lane, repr(at))
            else:
                pipe.hdel(self._k("switch"), lane)
            pipe.publish(self._channel, self._message("switch", lane=lane, off=off))

    def _reseed_switches(self, pipe: Any, view: LocalView, now: float) -> None:
        """This host's switched-off lanes (written at the next flush) and quarantines (queued on
        `pipe`, never over what Redis holds) back. Hold the lock."""
        for lane in view.switched_off:
            self._switch_writes.setdefault(lane, (True, now))
        for key, reason in self._quarantine.items():
            pipe.hsetnx(
                self._k("quarantine"),
                key,
                json.dumps({"verdict": "restored", "reason": reason, "at": now}),
            )

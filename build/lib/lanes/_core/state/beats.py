"""The shared terms and the beats: each process (or host) announces its configured paid terms and
its view of the clock at every sync, and reads back the store's terms — the strictest of the live
announcements, or an operator's (`terms.py` decides; this module keeps them).

The rule, on both backends: a beat and the store's terms it agrees on are one atomic step, so no
process agrees on a view another is changing; the agreed ceiling is kept where every paid
reservation reads it in its own transaction or script (see `paid.py`). SQLite: `host_beat` and
`shared_terms` in one immediate transaction, stamped with the host's clock (`beat.now`). Redis: a
hash of hosts and the operator's key in one optimistic transaction (WATCH), stamped with the
server's clock (TIME), the ceiling in `lanes:ceiling` (integer pico-dollars).
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any, Protocol

import attrs

from lanes._core.state import terms
from lanes._core.state.backend import RedisBase, SQLiteBase, guarded, json_object, text
from lanes._core.state.redis_scripts import PICO
from lanes._core.state.sqlite_file import immediate

SCHEMA = """
CREATE TABLE IF NOT EXISTS host_beat (host TEXT PRIMARY KEY, data TEXT);
CREATE TABLE IF NOT EXISTS shared_terms (
    id INTEGER PRIMARY KEY CHECK (id = 1), ceiling FLOAT, data TEXT);
"""


class SharedTerms(Protocol):
    """This process in the store, its beat, and an operator's terms (`lanes ceiling set`)."""

    @property
    def host_id(self) -> str: ...
    def heartbeat(self, beat: terms.Beat) -> terms.Pulse | None: ...
    def set_terms(self, operator: terms.Operator) -> None: ...
    def withdraw(self) -> None: ...


def _hosts(rows: Any) -> list[terms.Host]:
    """The hosts a store keeps, from its (id, JSON) rows; an entry we can not read is skipped."""
    return [h for key, data in rows if (h := terms.host_from(text(key), json_object(data)))]


def _operator(raw: object) -> terms.Operator | None:
    """What an operator set, from its stored JSON (None: nothing, or nothing we can read)."""
    return None if raw is None else terms.operator_from(json_object(raw))


def shared_ceiling(conn: sqlite3.Connection) -> float | None:
    """The ceiling the store's terms hold every reservation to (None: none agreed yet)."""
    row = conn.execute("SELECT ceiling FROM shared_terms WHERE id = 1").fetchone()
    return None if row is None or row[0] is None else float(row[0])


def operator_of(conn: sqlite3.Connection) -> terms.Operator | None:
    """What an operator set, as the file keeps it (None: nothing, or nothing we can read)."""
    row = conn.execute("SELECT data FROM shared_terms WHERE id = 1").fetchone()
    return None if row is None else _operator(row[0])


def set_operator(conn: sqlite3.Connection, op: terms.Operator) -> None:
    """Keep what an operator set: its fields replace the ones already set, the others stay (one
    immediate transaction)."""
    with immediate(conn):
        old = operator_of(conn) or terms.Operator()
        conn.execute(
            "INSERT INTO shared_terms (id, data) VALUES (1, ?) "
            "ON CONFLICT (id) DO UPDATE SET data = excluded.data",
            (json.dumps(terms.operator_fields(terms.merged(old, op))),),
        )


class SQLiteBeats(SQLiteBase):
    """The terms and beats in the host's SQLite file."""

    @property
    def host_id(self) -> str:
        return self._process

    def heartbeat(self, beat: terms.Beat) -> terms.Pulse:
        """This process's beat, stamped with the host's clock (`beat.now`), and the store's terms
        it agrees on — one immediate transaction."""
        with self._lock, immediate(self._conn) as conn:
            hosts = _hosts(conn.execute("SELECT host, data FROM host_beat"))
            own, gone, pulse = terms.beat(hosts, operator_of(conn), beat, beat.now)
            conn.execute(
                "INSERT OR REPLACE INTO host_beat (host, data) VALUES (?, ?)",
                (beat.host, json.dumps(terms.host_fields(own))),
            )
            conn.executemany("DELETE FROM host_beat WHERE host = ?", [(h,) for h in gone])
            if pulse.agreed is not None:
                conn.execute(
                    "INSERT INTO shared_terms (id, ceiling) VALUES (1, ?) "
                    "ON CONFLICT (id) DO UPDATE SET ceiling = excluded.ceiling",
                    (pulse.agreed.terms.ceiling_usd,),
                )
        return pulse

    def set_terms(self, operator: terms.Operator) -> None:
        with self._lock:
            set_operator(self._conn, operator)

    def withdraw(self) -> None:
        """Leave: this process's announcement holds no one back any more."""
        with self._lock, self._conn:
            self._conn.execute("DELETE FROM host_beat WHERE host = ?", (self._process,))

    def _reseed_terms(self, view_operator: terms.Operator | None) -> None:
        """Put back what an operator set, as this process last saw it, unless the file holds one."""
        if view_operator is not None:
            with self._lock:
                if operator_of(self._conn) is None:  # what the lost file held, kept
                    set_operator(self._conn, view_operator)


class RedisBeats(RedisBase):
    """The terms and beats in Redis, shared by every host."""

    _operator: terms.Operator | None  # what an operator set, as last seen
    _peers: frozenset[str]  # the other hosts live at this host's last beat

    @property
    def host_id(self) -> str:
        return self._host

    @guarded
    def heartbeat(self, beat: terms.Beat) -> terms.Pulse | None:
        """This host's beat, stamped with the server's clock (TIME), and the store's terms it
        agrees on, in one optimistic transaction (WATCH): no host agrees on hosts or an operator's
        terms another is changing. None when others kept changing them (the next sync beats)."""
        import redis  # loaded already: the store's client is redis-py's

        hosts_key, operator_key = self._k("hosts"), self._k("operator")
        with self._redis.pipeline() as pipe:
            for _ in range(5):
                try:
                    pipe.watch(hosts_key, operator_key)
                    now = _server_time(pipe)
                    hosts = _hosts(pipe.hgetall(hosts_key).items())
                    operator = _operator(pipe.get(operator_key))
                    own, gone, pulse = terms.beat(hosts, operator, beat, now)
                    pipe.multi()
                    pipe.hset(hosts_key, beat.host, json.dumps(terms.host_fields(own)))
                    if gone:
                        pipe.hdel(hosts_key, *gone)
                    if pulse.agreed is not None:
                        pipe.set(self._k("ceiling"), round(pulse.agreed.terms.ceiling_usd * PICO))
                    pipe.execute()
                except redis.WatchError:
                    continue
                with self._lock:
                    self._operator = operator
                    self._peers = frozenset(h.announced.host for h in pulse.hosts) - {self._host}
                return attrs.evolve(pulse, store_time=now)
        return None

    def _live_hosts(self) -> frozenset[str]:
        """The other hosts Redis lists as live now (seen within `LIVE_S` of the latest beat)."""
        hosts = _hosts(self._redis.hgetall(self._k("hosts")).items())
        latest = max((h.announced.seen for h in hosts), default=0.0)
        live = {h.announced.host for h in hosts if h.announced.seen >= latest - terms.LIVE_S}
        return frozenset(live - {self._host})

    @guarded
    def set_terms(self, operator: terms.Operator) -> None:
        """Keep what an operator set (stamped with the server's clock), over what was set before."""
        import redis  # loaded already: the store's client is redis-py's

        key = self._k("operator")
        with self._redis.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(key)
                    now = _server_time(pipe)
                    old = _operator(pipe.get(key)) or terms.Operator()
                    stamped = attrs.evolve(operator, ceiling_at=now, consent_at=now)
                    pipe.multi()
                    pipe.set(key, json.dumps(terms.operator_fields(terms.merged(old, stamped))))
                    pipe.execute()
                    return
                except redis.WatchError:
                    continue

    @guarded
    def withdraw(self) -> None:
        """Leave: this host's announcement holds no one back any more."""
        self._redis.hdel(self._k("hosts"), self._host)

    def _reseed_terms(self, pipe: Any) -> None:
        """Put back what an operator set, as this host last saw it, unless Redis holds one (queued
        on `pipe`; hold the lock)."""
        if self._operator is not None:
            pipe.set(
                self._k("operator"), json.dumps(terms.operator_fields(self._operator)), nx=True
            )


def _server_time(pipe: Any) -> float:
    """The Redis server's clock (TIME), epoch seconds."""
    seconds, micros = pipe.time()
    return float(seconds + micros / 1e6)

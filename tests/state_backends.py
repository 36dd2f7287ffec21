"""The two backends every state contract runs on (tests/test_state_contract_*.py): several
processes on one SQLite file (a temp file), or several hosts on one real `redis-server`.

A contract test asks `State` for as many stores on one state as it needs, and writes what the
state sync would (`sync()`: Redis queues settlements, grants, switches and probe releases until a
flush, and reads its ledger and grants back at the next sync; SQLite does both at once)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from lanes._core.state.store import LocalView, SQLiteStore, Store

BACKENDS = ("sqlite", "redis")
EMPTY_VIEW = LocalView(usage=[], spend={}, backoffs={}, snapshots={}, switched_off=frozenset())


class State:
    """One state (a SQLite file, or a Redis server) and the stores opened on it."""

    def __init__(self, kind: str, folder: Path, url: str | None = None) -> None:
        self.kind, self.folder, self.url = kind, folder, url
        self.stores: list[Store] = []
        self._files = itertools.count()
        self.path = ""
        self.fresh()

    def fresh(self) -> None:
        """A new, empty state (stores opened before stay on the old one: close them first)."""
        self.path = str(self.folder / f"state-{next(self._files)}.db")
        if self.url is not None:
            self._redis().flushall()

    def open(self) -> Store:
        """Another process (SQLite) or host (Redis) on this state, synchronised once."""
        if self.url is None:
            store: Store = SQLiteStore(self.path)
        else:
            from lanes._core.state.redis_store import RedisStore

            store = RedisStore(self.url, local=SQLiteStore(":memory:"), loss_hold_s=0.0)
            store.begin_sync(time.time())
            store.flush()  # a first full sync: the store is up
        self.stores.append(store)
        return store

    def pair(self) -> tuple[Store, Store]:
        return self.open(), self.open()

    def forget(self) -> None:
        """The state loses everything: `rm state.db*`, or a Redis restart without persistence."""
        if self.url is None:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        else:
            from lanes._core.state.redis_store import RedisStore

            self._redis().flushall()
            for store in self.stores:  # as their next call, failing on the restart, leaves them
                if isinstance(store, RedisStore):
                    store.up = False

    def close(self) -> None:
        for store in self.stores:
            store.close()
        self.stores = []

    def _redis(self) -> Any:
        import redis

        assert self.url is not None, "a SQLite state has no Redis"
        return redis.Redis.from_url(self.url, decode_responses=True)


def sync(*stores: Store, now: float | None = None) -> None:
    """What a round of the state sync does on each store — writes, then reads (no reseed) — once
    every store has written: Redis answers `paid_spent` as of its last sync."""
    for store in stores:
        store.flush()
    for store in stores:
        store.begin_sync(time.time() if now is None else now)


def resync(store: Store, view: LocalView = EMPTY_VIEW, now: float | None = None) -> bool:
    """One round of the sync after a loss: True when the store asked for (and got) a reseed."""
    now = time.time() if now is None else now
    lost = store.begin_sync(now)
    if lost:
        store.reseed(view, now)
    store.flush()
    return lost


@contextmanager
def open_state(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[State]:
    """The state of the backend `request.param` names; its stores closed afterwards."""
    url = request.getfixturevalue("redis_server").url if request.param == "redis" else None
    state = State(request.param, tmp_path, url)
    try:
        yield state
    finally:
        state.close()

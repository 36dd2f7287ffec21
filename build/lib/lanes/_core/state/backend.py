"""What every state store is before it holds anything: where it is, whether it answers, how a call
reaches it, and how it is kept in step with this process's view — plus the connection each
concern's half of a store (`memory.py`, `paid.py`, `approvals.py`, `grants.py`, `leases.py`,
`switches.py`, `beats.py`) shares with the others.

`SQLiteBase` is one SQLite file and the lock around its connection; `RedisBase` is one Redis
client with its key prefix and event channel. A store class (`store.SQLiteStore`,
`redis_store.RedisStore`) is the base with one half of each concern on it.

Errors: `StoreUnavailable` (the store can not be reached now, or is not resynchronised),
`ClockRefused` (the store's clock refused a reservation); `STORE_ERRORS` is what a caller catches
as "the store is down".
"""

from __future__ import annotations

import functools
import json
import sqlite3
import threading
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from typing import Any, Protocol, TypeVar

import attrs
import trio

from lanes._core.freetier.backoff import Backoff
from lanes._core.freetier.headers import RateLimitSnapshot
from lanes._core.freetier.windows import Key as UsageKey
from lanes._core.state import terms
from lanes._core.state.change_word import ChangeWord
from lanes._core.state.sqlite_file import identity

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


class StoreUnavailable(Exception):
    """A shared store that can not be reached right now (Redis down, or not yet resynchronised)."""


class ClockRefused(Exception):
    """The store's clock refused a reservation: this process's wall is off by `skew_s` (the
    store's clock minus the wall) — more than the tolerance."""

    def __init__(self, skew_s: float) -> None:
        super().__init__(f"the store's clock is {skew_s:+.1f}s from this process's wall")
        self.skew_s = skew_s


STORE_ERRORS: tuple[type[Exception], ...] = (sqlite3.Error, StoreUnavailable)


@attrs.frozen(kw_only=True)
class News:
    """What the other processes sharing a store wrote since the last look (see `Syncing.peek`)."""

    backoffs: list[tuple[str, Backoff]]
    switches: set[str]  # every lane switched off now


@attrs.frozen(kw_only=True)
class LocalView:
    """What this process knows, pushed back into a shared store that lost its data (a Redis restart
    without persistence): counters and spend by their maximum, backoffs keeping the later
    deadline."""

    usage: list[tuple[UsageKey, int]]
    spend: dict[tuple[str, int], float]
    backoffs: dict[str, Backoff]
    snapshots: dict[str, tuple[float, RateLimitSnapshot]]
    switched_off: frozenset[str]
    operator: terms.Operator | None = None  # what an operator set, as this process last saw it


class Backend(Protocol):
    """Which store this is, and how a call reaches it (see `call`)."""

    @property
    def kind(self) -> str: ...  # "sqlite" or "redis"
    # shared between hosts: probes take a lease, changes are published
    @property
    def shared(self) -> bool: ...
    # None: calls run inline on the trio thread
    @property
    def limiter(self) -> trio.CapacityLimiter | None: ...
    # the thread that hears other hosts
    @property
    def listen_limiter(self) -> trio.CapacityLimiter | None: ...
    # reachable (and, for a shared ledger, resynchronised) at the last try
    @property
    def up(self) -> bool: ...
    @property
    def where(self) -> str: ...  # the file, or the Redis URL without its password
    def close(self) -> None: ...


class Syncing(Protocol):
    """How the state sync keeps a store and this process's view in step (see `sync.py`)."""

    @property
    def lost_reason(self) -> str: ...  # why the last `begin_sync` asked for a reseed ("": unknown)
    def begin_sync(self, now: float) -> bool: ...
    def reseed(self, view: LocalView, now: float) -> None: ...
    def flush(self) -> None: ...
    def peek(self, now: float) -> News | None: ...
    def listen(self, timeout_s: float) -> list[dict[str, Any]]: ...


#: The deadline (trio's clock) of the job on whose behalf store calls are made now, if any: set by
#: the walk, so every store call a job waits on is bounded by that job's deadline.
job_deadline: ContextVar[float | None] = ContextVar("lanes_job_deadline", default=None)


async def call(store: Backend, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run one store call from trio: inline for a local store (SQLite: a short local transaction,
    cheaper than a thread hop, and deterministic under the autojump clock), in a worker thread
    bounded by the store's limiter for a networked one (Redis), so the event loop never waits on a
    socket. Inside a job (`job_deadline` set) the wait ends at the job's deadline: the thread is
    abandoned to finish on its own and `StoreUnavailable` is raised."""
    if store.limiter is None:
        return fn(*args, **kwargs)
    work = functools.partial(fn, *args, **kwargs)
    deadline = job_deadline.get()
    if deadline is None:
        return await trio.to_thread.run_sync(work, limiter=store.limiter)
    with trio.move_on_at(deadline):
        return await trio.to_thread.run_sync(work, limiter=store.limiter, abandon_on_cancel=True)
    raise StoreUnavailable(f"{store.where}: no answer before the job's deadline")


class SQLiteBase:
    """One SQLite file (or `:memory:`), its connection and the lock every call holds around it;
    the change word beside it; this process's id in lease tokens and beats."""

    where: str
    up: bool  # False from a deleted or replaced file until it is reopened and reseeded
    lost_reason: str  # why the last reseed was needed, for the sync's one log line
    _path: str
    _conn: sqlite3.Connection
    _identity: tuple[int, int] | None
    _lock: threading.Lock
    _word: ChangeWord
    _process: str  # this process, in the tokens of its probe leases and in the beats

    def _moved(self) -> str:
        """Why the file at the path is no longer the one this process opened ('' when it is)."""
        if self._path == ":memory:":
            return ""
        now = identity(self._path)
        if now == self._identity:
            return ""
        return "the state file was deleted" if now is None else "the state file was replaced"

    def _check_file(self) -> None:
        """Raise `StoreUnavailable` while the file this process opened is not the one at the path
        (deleted or replaced) or has not been reseeded since: paid stays closed meanwhile."""
        moved = self._moved()
        if moved:
            self.up = False
            self.lost_reason = moved
        if not self.up:
            raise StoreUnavailable(
                f"{self.lost_reason or 'the state file changed'} ({self.where}); paid fallback "
                "closed until it is reopened"
            )


class RedisBase:
    """One Redis client (redis-py's synchronous one, called from worker threads), the key prefix,
    the channel changes are published on, and the lock around this host's caches and queues.

    redis-py is imported by `redis_store.py` only, when a store is configured so: its import is a
    third of a second, and most processes never need it."""

    where: str
    up: bool
    _host: str  # this process, in leases and published messages
    _channel: str
    _redis: Any
    _p: str  # the key prefix
    _lock: threading.Lock
    _scripts: dict[str, Any]

    def _k(self, *parts: object) -> str:
        return self._p + ":".join(str(p) for p in parts)

    def _message(self, kind: str, **fields: Any) -> str:
        """An event for the other hosts (see `listen`), marked as this host's."""
        return json.dumps({"t": kind, "from": self._host, **fields})

    def _script(self, lua: str) -> Any:
        """The registered script of `lua` (call it with keys, args and, in a pipeline, client)."""
        script = self._scripts.get(lua)
        if script is None:
            script = self._scripts[lua] = self._redis.register_script(lua)
        return script


def guarded(fn: F) -> F:
    """Redis errors become `StoreUnavailable` (and mark the store down until a full sync
    succeeds)."""

    @functools.wraps(fn)
    def wrapper(self: RedisBase, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(self, *args, **kwargs)
        except Exception as exc:
            if not unreachable(exc):
                raise
            self.up = False
            raise StoreUnavailable(
                f"redis at {self.where}: {type(exc).__name__}: {str(exc)[:160]}"
            ) from exc

    return wrapper  # type: ignore[return-value]


def unreachable(exc: Exception) -> bool:
    """A Redis error or a socket's: the server can not be reached (or refused the call)."""
    if isinstance(exc, OSError):
        return True
    import redis  # loaded already: the store's client is redis-py's

    return isinstance(exc, redis.RedisError)


def json_object(value: object) -> dict[str, Any]:
    """A stored JSON object (a row's text, a Redis reply); {} for a value we can not read."""
    try:
        data = json.loads(text(value))
    except (TypeError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def parsed(pairs: Iterable[tuple[str, Any]], read: Callable[[Any], T]) -> list[tuple[str, T]]:
    """`(key, read(value))` of each pair whose value `read` can read; one it can not (ValueError,
    TypeError, KeyError) is skipped, never fatal."""
    out = []
    for key, value in pairs:
        try:
            out.append((key, read(value)))
        except (ValueError, TypeError, KeyError):
            continue
    return out


def text(value: object) -> str:
    """A Redis reply as text (the client decodes responses already; this keeps the type honest)."""
    return value.decode() if isinstance(value, bytes) else str(value)


SEP = "\x1f"  # between the parts of a Redis hash field (scopes contain "/" and ":")

"""Opening a dispatcher: the shared pool, the lanes, the state store and the background tasks
(state sync, balance polls, startup reachability) — and `complete_sync` for code without trio."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import attrs
import httpx2
import trio

from lanes._core.audit.tracing import target
from lanes._core.cache.store import Entries, SQLiteEntries, cache_path
from lanes._core.check import check_config
from lanes._core.config.schema import Config, load_config, read_config
from lanes._core.dispatcher import Dispatcher
from lanes._core.model.candidates import Reply
from lanes._core.model.errors import ConfigError
from lanes._core.model.job import Job
from lanes._core.runtime.secrets import install_log_redaction
from lanes._core.runtime.tasks import Background
from lanes._core.runtime.wall import OFFSET_ENV, open_wall
from lanes._core.state.store import STORE_ERRORS, SQLiteStore, Store
from lanes._core.upstream.client import open_upstream
from lanes._core.upstream.loader import load_lanes

if TYPE_CHECKING:  # imported when a collector is configured, and only then
    from lanes._core.audit.telemetry import Telemetry

log = logging.getLogger("lanes")


@asynccontextmanager
async def open_dispatcher(
    config: Config | str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    epoch_now: float | None = None,
    simulate: bool = False,
) -> AsyncIterator[Dispatcher]:
    """Open a dispatcher over the lanes in `config` (a `Config` or a TOML path), under trio.

    Owns the shared HTTP pool, the lanes and their breakers for the block's duration. `env`
    (default `os.environ`) supplies API keys and the `FREE_LANE` kill switch. `epoch_now` (for
    simulations under a virtual clock) is the wall-clock epoch second that trio's clock reads
    now; by default the real one.

    `simulate=True` runs the simulated providers of `lanes serve --simulate` in this process, on
    127.0.0.1 (no keys, no network), and routes to them; `config`, if given, lends only its
    `state` and `local_state`. Paid fallback is allowed there (under a $0.05 daily ceiling), since
    no one is at hand to approve it, and the local model stays up.
    Raises `ConfigError` for a bad config; a lane that can not load is one log line, never an error.
    """
    env = os.environ if env is None else env
    install_log_redaction()  # before any key is read or any request is sent
    if simulate:
        if config is not None and not isinstance(config, Config):
            config = read_config(config, env=env)
        async with (
            open_simulated(state_of(config), env, library=True) as sim,
            open_over(sim.config, env=sim.env, epoch_now=epoch_now) as dispatcher,
        ):
            yield dispatcher
        return
    if config is None:
        raise ValueError(
            "open_dispatcher needs a config (a Config or a TOML path), or simulate=True"
        )
    async with open_over(config, env=env, epoch_now=epoch_now) as dispatcher:
        yield dispatcher


@asynccontextmanager
async def open_over(
    config: Config | str | os.PathLike[str],
    *,
    env: Mapping[str, str],
    epoch_now: float | None = None,
    transport: httpx2.AsyncBaseTransport | None = None,
    sync_interval_s: float = 0.5,
    store: Store | None = None,
) -> AsyncIterator[Dispatcher]:
    """`open_dispatcher` with the knobs a replay needs (`lanes whatif`): the upstreams' transport
    (in-process simulated providers instead of sockets), how often the state sync runs, and a
    store of its own (the config's is not opened, nor its response cache)."""
    install_log_redaction()  # before any key is read or any request is sent
    config = check_config(config, env=env)  # the check `lanes check-config` makes
    traces_to = target(config.telemetry, env)  # None: no traces, and no OpenTelemetry loaded
    opening_telemetry = _telemetry() if traces_to is not None else None
    wall = open_wall(epoch_now, env)
    if wall.offset_s:
        log.warning(
            "drill hook: %s=%g moves this process's wall clock; paid stays closed while it "
            "disagrees with the state store's clock by more than %gs (for drills only)",
            OFFSET_ENV,
            wall.offset_s,
            config.policy.clock_tolerance_s,
        )
    own = store is None  # the config's own store, and its response cache (a replay has neither)
    store = open_store(config) if store is None else store
    try:
        entries = open_entries(config) if own else None
    except BaseException:
        store.close()
        raise
    failure: Exception | None = None  # the caller's own error, raised as itself (never as a group)
    telemetry: Telemetry | None = None
    try:
        async with (
            open_upstream(transport=transport) as upstream,
            trio.open_nursery() as nursery,
        ):
            background = Background()  # the background tasks' health
            if opening_telemetry is not None and traces_to is not None:
                telemetry = opening_telemetry(traces_to, background.task("telemetry"))
                nursery.start_soon(telemetry.run)
            dispatcher = Dispatcher(
                config=config,
                loaded=load_lanes(config, upstream=upstream, env=env),
                env=env,
                store=store,
                wall=wall,
                background=background,
                traces=None if telemetry is None else telemetry.note,
                cache=entries,
            )
            await dispatcher.start(nursery, sync_interval_s=sync_interval_s)
            if not dispatcher.free_lane_on:
                log.warning("free lane off (FREE_LANE=off): serving from local and paid lanes only")
            log.info("lanes ready: %s", ", ".join(dispatcher.lanes) or "none")
            try:
                yield dispatcher
            except Exception as exc:  # re-raised below, outside the nursery: never in a group
                failure = exc
            finally:
                try:
                    await _kept(dispatcher)
                finally:
                    nursery.cancel_scope.cancel()
    finally:
        if telemetry is not None:
            await telemetry.aclose()  # the last jobs' spans, within the export timeout
        if entries is not None:
            entries.close()
        store.close()
    if failure is not None:
        raise failure


#: How long a closing dispatcher waits for its cache's writer, at most, seconds: the answers
#: handed over in its last gathering window (`cache.GROUP_S`) are written, not dropped.
KEEP_S = 2.0


async def _kept(dispatcher: Dispatcher) -> None:
    """Wait (up to `KEEP_S`) until the answers handed to the cache's writer are written: a
    library block that ends right after its last job would otherwise lose them."""
    if dispatcher.cache is not None:
        with trio.move_on_after(KEEP_S):
            await dispatcher.cache.settled()


def _telemetry() -> type[Telemetry]:
    """The traces' exporter (OpenTelemetry's SDK): imported here, only when configured."""
    try:
        from lanes._core.audit.telemetry import Telemetry
    except ImportError as exc:
        raise ConfigError(
            f"telemetry.otlp_endpoint: traces need OpenTelemetry ({exc.name} is not installed); "
            "pip install 'lanes[otel]', or unset the endpoint",
            key="telemetry.otlp_endpoint",
        ) from None
    return Telemetry


@attrs.frozen(kw_only=True)
class Simulated:
    """The simulated providers running: their config (as TOML gives it, and loaded) and the
    environment with their keys."""

    data: dict[str, Any]
    config: Config
    env: Mapping[str, str]


@asynccontextmanager
async def open_simulated(
    state: tuple[str, str], env: Mapping[str, str], *, library: bool = False
) -> AsyncIterator[Simulated]:
    """`--simulate`, wherever it is asked for — `lanes serve`, `--workers`, `open_dispatcher
    (simulate=True)`: the simulated providers started on 127.0.0.1 and the config that routes to
    them, on `state` (the state and the local state: a file, `:memory:` or Redis). `library`: for
    code with no operator at hand — paid fallback allowed (under the simulation's $0.05 ceiling)
    and the local model steady; the sidecar's asks for approval and its local model flaps."""
    from lanes.testing.simulate import open_simulation  # the fakes load only when asked for

    fallback = "allow" if library else "ask"
    async with open_simulation(
        env, state=state[0], local_state=state[1], fallback=fallback, flap=not library
    ) as sim:
        yield Simulated(data=sim.config, config=load_config(sim.config, env=env), env=sim.env)


def state_of(config: Config | None) -> tuple[str, str]:
    """The state and local state `config` names (`:memory:` for both without one)."""
    return (config.state, config.local_state) if config else (":memory:", ":memory:")


def open_entries(config: Config) -> Entries | None:
    """The response cache's entries, when `[cache]` turns it on: in the Redis state store (every
    host's), else in a SQLite file beside the state; None when off (the section's `off` is every
    client's, whatever a client's own `cache` says)."""
    if config.cache.mode == "off":
        return None
    if config.shared_state:
        from lanes._core.cache.redis_entries import RedisEntries  # imported only when configured

        return RedisEntries(config.state, namespace=config.state_namespace)
    return SQLiteEntries(cache_path(config.state))


def clear_left(config: Config, client: str | None) -> int:
    """Delete what the response cache of an earlier config left (`lanes cache clear` while
    `[cache]` is off now): `client`'s entries, or every one, in the Redis state store or in the
    SQLite file beside the state (none is made where there is none); how many. Blocking."""
    if config.shared_state:
        from lanes._core.cache.redis_entries import RedisEntries  # imported only when configured

        left: Entries = RedisEntries(config.state, namespace=config.state_namespace)
    else:
        path = cache_path(config.state)
        if path == ":memory:" or not os.path.exists(path):
            return 0
        left = SQLiteEntries(path)
    try:
        return left.clear(client)
    finally:
        left.close()


def open_store(config: Config) -> Store:
    """The configured state store: a SQLite file (or `:memory:`), or Redis for several hosts."""
    if config.shared_state:
        from lanes._core.state.redis_store import RedisStore  # imported only when configured

        if config.local_state == ":memory:":
            log.warning(
                "state store: redis with local_state in memory: this host's own paid "
                "reservations do not survive its restart, so if Redis loses its data while the "
                "hosts restart the day's spend can not be put back; set local_state to a file"
            )
        return RedisStore(
            config.state,
            local=SQLiteStore(config.local_state),
            namespace=config.state_namespace,
            min_replicas=config.state_redis_min_replicas,
        )
    return SQLiteStore(config.state)


def describe_state(config: Config) -> dict[str, Any]:
    """The configured state store as it answers now (`lanes check-config --connect`)."""
    store = open_store(config)
    try:
        if not config.shared_state:
            return {"where": store.where, "kind": "sqlite", "paid_can_open": True, "why_not": ""}
        from lanes._core.state.redis_store import RedisStore  # loaded already by open_store

        assert isinstance(store, RedisStore)
        try:
            return store.describe()
        except STORE_ERRORS as exc:
            return {"where": store.where, "paid_can_open": False, "why_not": str(exc)}
    finally:
        store.close()


def complete_sync(
    config: Config | str | os.PathLike[str] | None,
    job: Job,
    *,
    env: Mapping[str, str] | None = None,
    simulate: bool = False,
) -> Reply:
    """`complete` (or, for a job with `input`, `embed`) for code that does not run trio: opens a
    dispatcher (`simulate` as in `open_dispatcher`), serves one job, closes it.

    The job must carry `deadline_s` (or none, for the configured default): an absolute
    `deadline_at` means nothing outside the trio run it was taken from.
    """
    if job.deadline_at is not None:
        raise ValueError("complete_sync needs a relative deadline_s, not deadline_at")

    async def one() -> Reply:
        async with open_dispatcher(config, env=env, simulate=simulate) as dispatcher:
            return await (dispatcher.embed(job) if job.embedding else dispatcher.complete(job))

    return trio.run(one)

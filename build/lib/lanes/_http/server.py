"""`lanes serve`: the dispatcher and the HTTP app in one trio run, on hypercorn's trio worker.

Startup never waits on a provider. SIGINT/SIGTERM stop accepting, let in-flight jobs finish (up
to `shutdown_grace_s`), then the dispatcher closes and flushes the state store. A single process
never re-reads its config: SIGHUP is logged and ignored (`lanes serve --workers N` reloads on it,
in its parent: `team.py`). Connections are accepted and bounded by `connections.py`.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import trio
from hypercorn.config import Config as HypercornConfig

from lanes._core.config.schema import Config, ServerConfig, packaged
from lanes._core.model.errors import ConfigError
from lanes._core.open import open_dispatcher, open_simulated, state_of
from lanes._core.source import Source, read_source
from lanes._http.app import build_app, work_collector
from lanes._http.batches import open_batches
from lanes._http.connections import bind_of, connection_cap, serve_http
from lanes._http.guard import is_loopback, resolved_keys
from lanes._http.host_totals import HostTotals
from lanes._http.metrics import Metrics
from lanes._http.running import Running

log = logging.getLogger("lanes")
#: The cyclic collector's young-generation threshold in a process that serves and does nothing else
#: (CPython's default: 700). A request allocates hundreds of containers that nearly all die young,
#: by reference counting; at 700, a young collection ran every few requests, each walking what
#: every request in flight holds — about 0.1 ms of CPU per JSON request under load (`bench.hot`).
YOUNG_THRESHOLD = 10_000


def dedicate_gc() -> None:
    """Tune the cyclic garbage collector for a process that only serves: what startup built
    (modules, config, lanes, the app) is frozen — never walked again, so that a full collection no
    longer scans the whole heap (~30 ms) — and young collections run far less often. The cost:
    cyclic garbage waits for up to `YOUNG_THRESHOLD` allocations (resident memory measured
    unchanged). Never in a process that does more (tests, a job's own process)."""
    gc.collect()  # startup's own garbage goes first: what is frozen is never collected
    gc.freeze()
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(young, YOUNG_THRESHOLD), middle, old)


def checked(
    config: Config | Source | str | os.PathLike[str] | None,
    *,
    host: str | None,
    port: int | None,
    simulate: bool,
    env: Mapping[str, str],
) -> tuple[Config | None, str, int]:
    """The config `serve` runs (None: the simulation's, made at start), and the address it binds.
    A path is read (`read_source`). Raises `ConfigError` for a bad config, or a non-loopback bind
    without a client key."""
    base: Config | None = None
    if isinstance(config, Config):
        base = config
    elif isinstance(config, Source):
        base = config.check(env)
    elif config or not simulate:
        base = read_source(config or packaged("lanes.toml")).check(env)
    server = (
        base.server if base is not None and (not simulate or base is config) else ServerConfig()
    )
    host = host or server.host
    port = server.port if port is None else port
    if not is_loopback(host) and (simulate or not resolved_keys(server, env)):
        variables = [c.key_env for c in server.clients.values()]
        variables += [server.admin_key_env] if server.admin_key_env else []
        named = f" ({', '.join(variables)} unset or empty)" if variables else ""
        raise ConfigError(
            f"server.host: refusing to bind {host} with no client keys{named}; "
            + (
                "--simulate serves loopback only"
                if simulate
                else "set a client key in [server.clients] or bind 127.0.0.1"
            ),
            key="server.host",
        )
    return base, host, port


async def serve(
    config: Config | Source | str | os.PathLike[str] | None,
    *,
    host: str | None = None,
    port: int | None = None,
    simulate: bool = False,
    env: Mapping[str, str] | None = None,
    task_status: Any = trio.TASK_STATUS_IGNORED,
    listen_fd: int | None = None,
    running: Running | None = None,
    stop_when: Callable[[], Awaitable[object]] | None = None,
    hold: Callable[[], Awaitable[bool]] | None = None,
    dedicated: bool = False,
    epoch_now: float | None = None,
    state: str | None = None,
) -> None:
    """Run the sidecar until SIGINT/SIGTERM (or cancellation). `task_status` gets the bound URL.

    As one of `lanes serve --workers N` (see `workers.py`): `listen_fd` is the socket the parent
    bound, `running` says which worker this is (in logs and /health), what config it runs and
    where the parent's status is, `stop_when` returns when the parent is gone — a graceful
    stop, as for SIGTERM — and `hold`, once all is ready to serve, says whether to (the parent
    decides: a reload's new workers serve only when every one of them is ready). `dedicated`:
    this process does nothing but serve (`lanes serve`): its garbage collector is tuned for that
    (`dedicate_gc`). `epoch_now`: the wall-clock epoch second trio's clock reads now, as
    `open_dispatcher` takes it (tests under a virtual clock, on a day of their choosing). `state`:
    the SQLite state file, over the config's (`lanes serve --state`)."""
    env = dict(os.environ if env is None else env)
    if config is None and not simulate:
        config = packaged("lanes.toml")
    if isinstance(config, (str, os.PathLike)):
        config = read_source(config)
    running = running or Running(sha256=config.sha256 if isinstance(config, Source) else None)
    base, host, port = checked(config, host=host, port=port, simulate=simulate, env=env)
    base, where = _with_state(base, state)
    async with AsyncExitStack() as stack:
        if simulate:
            sim = await stack.enter_async_context(open_simulated(where, env))
            base, env = sim.config, dict(sim.env)
        assert base is not None
        config = base
        dispatcher = await stack.enter_async_context(
            open_dispatcher(config, env=env, epoch_now=epoch_now)
        )
        totals = None  # under --workers: /metrics shows the host's totals, not one worker's
        if running.status_path is not None:
            totals = HostTotals(Path(running.status_path).parent / "metrics", dispatcher.statistics)
        batches = await stack.enter_async_context(open_batches(config, dispatcher))
        work = work_collector(dispatcher, batches)
        app = build_app(
            dispatcher,
            env=env,
            bind_host=host,
            running=running,
            metrics=Metrics(totals.statistics, work) if totals else None,
            batches=batches,
        )
        if dedicated:
            dedicate_gc()
        if hold is not None and not await hold():
            return  # the dispatcher closes: nothing was served
        hc = _hypercorn(
            config.server, f"fd://{listen_fd}" if listen_fd is not None else bind_of(host, port)
        )
        cap = connection_cap(config.server.max_connections)
        shutdown = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_signals, shutdown, running.worker is not None)
            for task in (
                totals and totals.publish_every,
                batches and batches.runner.run,
                stop_when and partial(_stop_when, stop_when, shutdown),
            ):
                if task:
                    nursery.start_soon(task)

            async def run_server(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
                await serve_http(
                    app, hc, cap=cap, shutdown_trigger=shutdown.wait, task_status=task_status
                )
                nursery.cancel_scope.cancel()  # served its last request: a worker's watchers end

            binds = await nursery.start(run_server)
            url = binds[0] if binds else f"http://{host}:{port}"
            log.warning(
                "lanes serving on %s (lanes: %s)", url, ", ".join(dispatcher.lanes) or "none"
            )
            task_status.started(url)
            await shutdown.wait()
            nursery.cancel_scope.deadline = trio.current_time() + config.server.shutdown_grace_s + 1


def _with_state(base: Config | None, state: str | None) -> tuple[Config | None, tuple[str, str]]:
    """The config with `--state` over its `state`, and the (state, local state) a simulation
    runs on."""
    if state is None:
        return base, state_of(base)
    return (None if base is None else attrs.evolve(base, state=state)), (state, state_of(base)[1])


def _hypercorn(server: ServerConfig, bind: str) -> HypercornConfig:
    """Hypercorn's config for the sidecar: where it binds, how long shutdown and idle
    connections may take, no access log (the journal keeps one line a job)."""
    hc = HypercornConfig()
    hc.bind = [bind]
    hc.graceful_timeout = server.shutdown_grace_s
    hc.accesslog = None
    hc.errorlog = logging.getLogger("lanes.http")
    # the headers of a request, and the next request on a kept-alive connection, must come within
    # this (loopback clients reconnect cheaply; slow-loris is shed within it)
    hc.keep_alive_timeout = server.idle_timeout_s
    # hypercorn's default of 100 drops connects in a burst (seen: +1 s SYN retries)
    hc.backlog = 4096
    return hc


async def _signals(shutdown: trio.Event, worker: bool = False) -> None:
    """SIGINT/SIGTERM: stop accepting, let jobs in flight finish. SIGHUP: a single process logs
    and ignores it (a reload in place would rebuild lanes, breakers and ledgers under running
    jobs: `lanes serve --workers N` reloads by starting new workers beside the old); a worker
    ignores it quietly (its parent reloads). A second SIGINT/SIGTERM stops one sidecar at once; a
    worker ignores it (it comes from the terminal and the parent both, or from systemd and the
    parent: the parent decides when to stop waiting)."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async for signum in signals:
            if signum == signal.SIGHUP:
                if not worker:
                    log.warning(
                        "SIGHUP ignored — one `lanes serve` process reads its config at startup "
                        "only; restart it to apply a changed config (check it first: lanes "
                        "check-config PATH), or run `lanes serve --workers N`, which reloads on "
                        "SIGHUP"
                    )
                continue
            if shutdown.is_set():
                continue  # a worker's repeated signal
            log.warning("shutting down (in-flight jobs may finish)")
            shutdown.set()
            if not worker:
                return


async def _stop_when(stopped: Callable[[], Awaitable[object]], shutdown: trio.Event) -> None:
    await stopped()
    if not shutdown.is_set():
        log.warning("the parent process is gone: shutting down (in-flight jobs may finish)")
        shutdown.set()

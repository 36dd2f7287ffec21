"""`lanes serve --workers N`: N processes serving one port, each with its own dispatcher, all
sharing the state (the SQLite file, or Redis).

The parent checks the config and binds the listening sockets itself — so a port in use is one line
and exit 1, as with one process, and port 0 works — then starts N workers: `lanes serve` again,
told by the `LANES_WORKER` environment variable which socket it serves and which worker it is.
On Linux each worker has a socket of its own on the port (SO_REUSEPORT), and the kernel spreads
new connections evenly over them — one socket shared by every worker was measured giving one of
two workers 72 % of a burst of 64 connections, which then stay with it (keep-alive). The parent
keeps every socket open, so the connections queued for a worker that died wait for its
replacement instead of being refused. Elsewhere one socket is shared by all. The parent serves
nothing: it watches.

- **State.** The workers coordinate through the state store exactly as separate processes on one
  host do: the paid ceiling (one atomic reservation), the kill switch, grants and "approve once",
  pending approvals, backoffs (seen before the next attempt) and probe leases (one knock per
  closed door). With `state = ":memory:"` (the default) the parent makes a private state file for
  the run, deleted at exit, so the workers still share one state (and nothing survives a restart,
  as in memory); likewise `local_state` with Redis. Breakers, the ranking and the recent jobs stay
  per worker.
- **Signals.** SIGINT/SIGTERM to the parent stop every worker gracefully (jobs in flight may finish
  within `shutdown_grace_s`); a second one kills them at once. A worker whose parent dies — even by
  SIGKILL — stops gracefully on its own: it holds the read end of a pipe whose only write end the
  parent holds.
- **One config, and reloads** (see `team.py`): the workers run the bytes the parent read, never
  the file; a worker started again after a crash runs the config that was running, after a
  backoff; SIGHUP (or `lanes reload`) is the only way a new config enters, on every worker at
  once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import socket
import sys
import tempfile
from collections.abc import Mapping
from contextlib import AsyncExitStack
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import trio
from hypercorn.config import Config as HypercornConfig

from lanes._core.config.schema import REDIS_SCHEMES, Config, ServerConfig, load_config, packaged
from lanes._core.model.errors import ConfigError
from lanes._core.open import open_simulated
from lanes._core.source import Source, read_source
from lanes._http.connections import bind_of
from lanes._http.processes import WORKER_ENV, WorkerPlan
from lanes._http.running import Running
from lanes._http.server import checked, serve
from lanes._http.team import Team

log = logging.getLogger("lanes")
MAX_WORKERS = 64
__all__ = ["MAX_WORKERS", "WORKER_ENV", "listen", "run_worker", "serve_workers", "until_eof"]


def listen(host: str, port: int, count: int, backlog: int = 4096) -> list[socket.socket]:
    """A listening socket per worker, all on one port (SO_REUSEPORT: the kernel spreads new
    connections evenly over them), made as hypercorn makes its own (TCP_NODELAY, SO_REUSEADDR,
    non-blocking). Where SO_REUSEPORT does not spread connections (not Linux): one socket, shared by
    every worker. Raises OSError (EADDRINUSE, EACCES, …)."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count if sys.platform == "linux" else 1):
            hc = HypercornConfig()
            hc.workers = 2  # hypercorn sets SO_REUSEPORT for more than one worker
            hc.bind = [bind_of(host, port)]
            [sock] = hc.create_sockets().insecure_sockets
            sockets.append(sock)
            sock.listen(backlog)
            port = sock.getsockname()[1]  # port 0: the one the first socket was given
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _private(state: str, tmp: str, name: str) -> str:
    return str(Path(tmp) / name) if state == ":memory:" else state


@attrs.define
class _Planner:
    """Makes the plans the workers run: the checked config's bytes in a private copy (`tmp`, which
    only this process and its workers read), and the spec every worker is told."""

    path: str
    tmp: Path
    spec: dict[str, Any]  # what every plan's workers are told besides their config
    env: Mapping[str, str]
    host: str | None  # --host and --port, as given
    port: int | None
    address: tuple[str, int] = ("", 0)  # what the first config and the flags bound
    state: tuple[str, str] = ("", "")  # the first config's `state` and `local_state`
    made: int = 0

    def plan(self, source: Source, config: Config) -> WorkerPlan:
        self.made += 1
        file = self.tmp / f"config-{self.made}.toml"
        fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(source.data)
        spec = {**self.spec, "config": source.where, "config_file": str(file)}
        spec["config_sha256"] = source.sha256
        return WorkerPlan(
            spec=spec,
            sha256=source.sha256,
            raw=source.toml(),
            grace_s=config.server.shutdown_grace_s,
            file=file,
            config=config,
        )

    def replan(self) -> WorkerPlan:
        """A plan from the file as it is now; `ConfigError` naming the key when it does not
        pass, or changes what only a restart can (the address bound, `state`, `local_state`)."""
        source = read_source(self.path)
        config, host, port = checked(
            source, host=self.host, port=self.port, simulate=False, env=self.env
        )
        assert config is not None
        where = source.where
        if not config.lanes:
            raise ConfigError(
                f"{where}: lanes: the file names no lane (empty, or cut short mid-write?); a "
                "reload to nothing is refused — to stop serving, stop the sidecar",
                key="lanes",
            )
        if (host, port) != self.address:
            raise ConfigError(
                f"{where}: server.host / server.port: a reload can not move the sidecar (the "
                "parent listens on the address it started on); restart it to move it",
                key="server.port",
            )
        for key, was, now in zip(
            ("state", "local_state"), self.state, (config.state, config.local_state), strict=True
        ):
            if was != now:
                raise ConfigError(
                    f"{where}: {key}: a reload can not move the state (the ledger, switches and "
                    "approvals live there); restart the sidecar to move it",
                    key=key,
                )
        return self.plan(source, config)


def _sim_plan(spec: dict[str, Any], data: dict[str, Any]) -> WorkerPlan:
    sha256 = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
    spec = {**spec, "data": data, "config_sha256": sha256}
    return WorkerPlan(spec=spec, sha256=sha256, raw=None, grace_s=ServerConfig().shutdown_grace_s)


async def serve_workers(
    config: str | os.PathLike[str] | None,
    *,
    workers: int,
    host: str | None = None,
    port: int | None = None,
    simulate: bool = False,
    log_format: str = "text",
    log_level: str = "warning",
    env: Mapping[str, str] | None = None,
) -> int:
    """Run `workers` sidecar processes on one socket until SIGINT/SIGTERM; the exit code."""
    env = dict(os.environ if env is None else env)
    source = read_source(config or packaged("lanes.toml")) if config or not simulate else None
    base, bound_host, bound_port = checked(source, host=host, port=port, simulate=simulate, env=env)
    with tempfile.TemporaryDirectory(prefix="lanes-workers-") as tmp:
        async with AsyncExitStack() as stack:
            state = _private(base.state if base else ":memory:", tmp, "state.db")
            local = base.local_state if base else ":memory:"
            spec: dict[str, Any] = {"host": bound_host, "port": bound_port, "state": state}
            spec |= {"log_level": log_level, "status": str(Path(tmp) / "status.json")}
            shared = state.partition("://")[0] in REDIS_SCHEMES
            spec["local_state"] = _private(local, tmp, "local.db") if shared else local
            sockets = listen(bound_host, bound_port, workers)
            for sock in sockets:
                stack.callback(sock.close)
            watch, parent = os.pipe()  # the workers read `watch`: EOF when this process is gone
            stack.callback(os.close, watch)
            stack.callback(os.close, parent)
            spec |= {"fds": [s.fileno() for s in sockets], "watch": watch, "parent": os.getpid()}
            planner = _Planner(
                path=str(config or packaged("lanes.toml")),
                tmp=Path(tmp),
                spec=spec,
                env=env,
                host=host,
                port=port,
                address=(bound_host, bound_port),
                state=(base.state, base.local_state) if base else ("", ""),
            )
            if simulate:
                sim = await stack.enter_async_context(
                    open_simulated((state, spec["local_state"]), env)
                )
                plan, env = _sim_plan(spec, sim.data), dict(sim.env)
            else:
                assert source is not None and base is not None
                plan = planner.plan(source, base)
            url = "http://" + bind_of(*sockets[0].getsockname()[:2])
            log.warning(
                "lanes serving on %s with %d workers (config %s)", url, workers, plan.sha256[:12]
            )
            team = Team(
                plan,
                count=workers,
                env=env,
                log_format=log_format,
                status_path=Path(tmp) / "status.json",
                replan=None if simulate else planner.replan,
            )
            return await team.run()


def _worker_config(spec: Mapping[str, Any], env: dict[str, str]) -> Config:
    """The config the parent handed this worker: its private copy's bytes (never the file),
    checked against the hash the parent gave."""
    if "data" in spec:
        return load_config(spec["data"], env=env)
    source = Source(where=spec["config"], data=Path(spec["config_file"]).read_bytes())
    if source.sha256 != spec["config_sha256"]:
        raise ConfigError(
            f"{spec['config_file']}: the parent's copy of {spec['config']} changed under this "
            "worker; restart the sidecar"
        )
    config = source.check(env)
    return attrs.evolve(config, state=spec["state"], local_state=spec["local_state"])


async def until_eof(fd: int) -> None:
    """Until the write end of the pipe `fd` reads from is closed (EOF): the parent's watch pipe,
    which every worker, old and new, shares as one open file, and so its O_NONBLOCK flag: a
    `trio.lowlevel.FdStream` would set it, and put it back to blocking when it closes, so a
    retired worker leaving made its successor's next read block the whole process (serving
    nothing after saying it served). So the flags are never touched: a read only once epoll says
    the pipe is readable, which a read answers at once. Nothing is written to it: readable
    means EOF (or bytes, read and ignored)."""
    while True:
        await trio.lowlevel.wait_readable(fd)
        try:
            if not os.read(fd, 4096):
                return
        except BlockingIOError:  # another worker read what woke us
            continue


def run_worker(spec: Mapping[str, Any]) -> int:
    """One worker: the config the parent checked (the state it shares), served on its socket until
    a signal, or until the parent is gone. It tells the parent it is ready through
    `spec["ready"]`, and serves once told to through `spec["go"]`."""
    env = dict(os.environ)
    if "data" in spec:
        from lanes.testing.simulate import SIM_KEYS

        env = {**SIM_KEYS, **env}
    config = _worker_config(spec, env)
    running = Running(
        sha256=spec["config_sha256"],
        worker=spec["worker"],
        parent_pid=spec["parent"],
        status_path=spec["status"],
    )

    async def hold() -> bool:
        """Tell the parent this worker is ready; serve when it says so (EOF: it decided not)."""
        with contextlib.suppress(OSError):  # the parent is gone: the EOF below says so
            os.write(spec["ready"], b"1")
        os.close(spec["ready"])
        async with trio.lowlevel.FdStream(spec["go"]) as go:
            return bool(await go.receive_some(1))

    trio.run(
        lambda: serve(
            config,
            host=spec["host"],
            port=spec["port"],
            env=env,
            listen_fd=spec["fd"],
            running=running,
            stop_when=partial(until_eof, spec["watch"]),
            hold=hold,
            dedicated=True,
        )
    )
    return 0

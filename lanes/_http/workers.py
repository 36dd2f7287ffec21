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
- **A worker that exits** on its own is logged (its number, pid and how it ended) and started
  again. When workers have exited `RESTARTS` times within `RESTART_WINDOW_S`, the parent stops the
  others and exits 1: a worker that can not start does not restart for ever.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import tempfile
from collections.abc import Mapping
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import attrs
import trio
from hypercorn.config import Config as HypercornConfig

from lanes._core.check import check_config
from lanes._core.config import REDIS_SCHEMES, Config, ServerConfig, load_config, packaged
from lanes._http.server import checked, serve

log = logging.getLogger("lanes")
WORKER_ENV = "LANES_WORKER"  # the spec a worker process is started with (JSON)
MAX_WORKERS = 64
RESTARTS = 5  # worker exits within RESTART_WINDOW_S that stop the sidecar (exit 1)
RESTART_WINDOW_S = 60.0


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
            hc.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
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
    base, host, port = checked(config, host=host, port=port, simulate=simulate, env=env)
    grace_s = (
        base.server.shutdown_grace_s if base and not simulate else ServerConfig().shutdown_grace_s
    )
    with tempfile.TemporaryDirectory(prefix="lanes-workers-") as tmp:
        async with AsyncExitStack() as stack:
            state = _private(base.state if base else ":memory:", tmp, "state.db")
            local = base.local_state if base else ":memory:"
            spec: dict[str, Any] = {"host": host, "port": port, "state": state, "count": workers}
            spec["log_level"] = log_level
            shared = state.partition("://")[0] in REDIS_SCHEMES
            spec["local_state"] = _private(local, tmp, "local.db") if shared else local
            if simulate:
                from lanes.testing.simulate import SIM_KEYS, open_simulation, simulated_config

                fakes = await stack.enter_async_context(open_simulation())
                spec["data"] = simulated_config(
                    fakes, state=spec["state"], local_state=spec["local_state"]
                )
                env = {**SIM_KEYS, **env}
                log.warning(
                    "simulated providers on 127.0.0.1: %s",
                    ", ".join(f"{n}={f.port}" for n, f in fakes.items()),
                )
            else:
                spec["config"] = str(config or packaged("lanes.toml"))
            sockets = listen(host, port, workers)
            for sock in sockets:
                stack.callback(sock.close)
            watch, parent = os.pipe()  # the workers read `watch`: EOF when this process is gone
            stack.callback(os.close, watch)
            stack.callback(os.close, parent)
            spec |= {"fds": [sock.fileno() for sock in sockets], "watch": watch}
            name = sockets[0].getsockname()
            url = (
                f"http://[{name[0]}]:{name[1]}" if ":" in name[0] else f"http://{name[0]}:{name[1]}"
            )
            log.warning("lanes serving on %s with %d workers", url, workers)
            team = _Team(spec, env, log_format, grace_s)
            return await team.run()


class _Team:
    """The parent's view of its workers: start them, start again the ones that exit, stop them."""

    def __init__(
        self, spec: dict[str, Any], env: Mapping[str, str], log_format: str, grace_s: float
    ) -> None:
        self._spec, self._env, self._log_format, self._grace_s = spec, env, log_format, grace_s
        self._processes: dict[int, trio.Process] = {}
        self._exits: list[float] = []
        self._stopping = trio.Event()
        self._code = 0

    async def run(self) -> int:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._signals)
            async with trio.open_nursery() as slots:
                for number in range(1, self._spec["count"] + 1):
                    slots.start_soon(self._keep, number)
                await self._stopping.wait()
                for process in self._processes.values():
                    if process.returncode is None:
                        process.terminate()
                nursery.start_soon(self._kill_after, self._grace_s + 5.0)
            nursery.cancel_scope.cancel()
        return self._code

    async def _spawn(self, number: int) -> trio.Process:
        fds = self._spec["fds"]
        spec = {**self._spec, "worker": number, "fd": fds[(number - 1) % len(fds)]}
        command = [sys.executable, "-m", "lanes", "serve", "--log-format", self._log_format]
        return await trio.lowlevel.open_process(
            command,
            env={**self._env, WORKER_ENV: json.dumps(spec)},
            pass_fds=(spec["fd"], spec["watch"]),
        )

    async def _keep(self, number: int) -> None:
        """Worker `number`, started again whenever it exits on its own."""
        while True:
            process = self._processes[number] = await self._spawn(number)
            if self._stopping.is_set():
                process.terminate()
            status = await process.wait()
            if self._stopping.is_set():
                return
            now = trio.current_time()
            self._exits = [t for t in self._exits if now - t < RESTART_WINDOW_S] + [now]
            if len(self._exits) >= RESTARTS:
                log.error(
                    "worker %d (pid %d) %s; workers exited %d times within %gs: stopping",
                    number,
                    process.pid,
                    _how(status),
                    len(self._exits),
                    RESTART_WINDOW_S,
                )
                self._code = 1
                self._stopping.set()
                return
            log.error("worker %d (pid %d) %s; starting it again", number, process.pid, _how(status))

    async def _signals(self) -> None:
        """SIGINT/SIGTERM: stop the workers gracefully; a second one: at once. SIGHUP: ignored
        (each worker says so)."""
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
            async for signum in signals:
                if signum == signal.SIGHUP:
                    continue
                if not self._stopping.is_set():
                    log.warning(
                        "stopping %d workers (in-flight jobs may finish)", len(self._processes)
                    )
                    self._stopping.set()
                    continue
                log.warning("stopping the workers at once")
                self._kill()

    async def _kill_after(self, seconds: float) -> None:
        await trio.sleep(seconds)
        self._kill()

    def _kill(self) -> None:
        for process in self._processes.values():
            if process.returncode is None:
                process.kill()


def _how(status: int) -> str:
    if status < 0:
        try:
            return f"was killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"was killed by signal {-status}"
    return f"exited with code {status}"


def run_worker(spec: Mapping[str, Any]) -> int:
    """One worker: the config the parent checked (the state it shares), served on its socket until
    a signal, or until the parent is gone."""
    env = dict(os.environ)
    if "data" in spec:
        from lanes.testing.simulate import SIM_KEYS

        env = {**SIM_KEYS, **env}
        config: Config = load_config(spec["data"], env=env)
    else:
        config = check_config(spec["config"], env=env).config
        config = attrs.evolve(config, state=spec["state"], local_state=spec["local_state"])

    async def parent_gone() -> None:
        async with trio.lowlevel.FdStream(spec["watch"]) as watch:
            while await watch.receive_some():
                pass

    trio.run(
        lambda: serve(
            config,
            host=spec["host"],
            port=spec["port"],
            env=env,
            listen_fd=spec["fd"],
            worker=spec["worker"],
            stop_when=parent_gone,
            dedicated=True,
        )
    )
    return 0

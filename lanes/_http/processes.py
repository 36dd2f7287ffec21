"""The parent's worker processes (`team.py` decides which run): each started on a `WorkerPlan`,
told to serve or to exit without serving, and stopped — gracefully, then at once.

A worker says it is ready by writing to a pipe the parent gave it (EOF first: it exited), and
serves when the parent writes to another (EOF: it exits without serving).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import trio

from lanes._core.config.schema import Config

log = logging.getLogger("lanes")
WORKER_ENV = "LANES_WORKER"  # the spec a worker process is started with (JSON)
READY_S = 30.0  # a worker not ready within this is stopped: it could not start
KILL_AFTER_S = 5.0  # past the grace, a worker that has not stopped is killed


@attrs.frozen(kw_only=True)
class WorkerPlan:
    """What every worker is started on: `spec` (its private config copy, `file`, and everything
    else a worker is told), the config's hash, its parsed TOML (for the change line: None under
    `--simulate`) and the graceful-stop time its workers get."""

    spec: Mapping[str, Any]
    sha256: str
    raw: Mapping[str, Any] | None
    grace_s: float
    file: Path | None = None
    config: Config | None = None  # the checked config (None under `--simulate`): its guard


def how_it_ended(status: int) -> str:
    """A worker's exit status (negative: the signal that killed it), said."""
    if status < 0:
        try:
            return f"was killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"was killed by signal {-status}"
    return f"exited with code {status}"


class Processes:
    """Every worker process the parent started and has not seen exit, and those ready and waiting
    to be told whether to serve."""

    def __init__(self, *, env: Mapping[str, str], log_format: str) -> None:
        self._env, self._log_format = env, log_format
        self._live: set[trio.Process] = set()
        self._held: dict[trio.Process, int] = {}  # ready workers waiting to be told to serve

    async def start(self, number: int, plan: WorkerPlan) -> tuple[trio.Process, str | None]:
        """Start worker `number` on `plan` and wait until it can serve — its config checked, its
        dispatcher open — which it then does only when told to (`release`): the process, and None —
        or how it failed (it is gone by then)."""
        fds = plan.spec["fds"]
        fd = fds[(number - 1) % len(fds)]
        reader, writer = os.pipe()  # the worker says "ready" on it
        hold, go = os.pipe()  # we say "serve" on it, or close it: "do not"
        spec = {**plan.spec, "worker": number, "fd": fd, "ready": writer, "go": hold}
        command = [sys.executable, "-m", "lanes", "serve", "--log-format", self._log_format]
        try:
            with trio.CancelScope(shield=True):  # a process started is a process we track
                process = await trio.lowlevel.open_process(
                    command,
                    env={**self._env, WORKER_ENV: json.dumps(spec)},
                    pass_fds=(fd, spec["watch"], writer, hold),
                )
                self._live.add(process)
                self._held[process] = go
        except BaseException:
            os.close(go)
            raise
        finally:
            os.close(writer)
            os.close(hold)
        pipe = trio.lowlevel.FdStream(reader)
        try:
            with trio.move_on_after(READY_S) as waiting:
                if await pipe.receive_some(16):
                    return process, None
        finally:
            with trio.CancelScope(shield=True):
                await pipe.aclose()
        if waiting.cancelled_caught:  # EOF instead means it exited (maybe not yet reaped)
            process.kill()
            with trio.CancelScope(shield=True):
                await process.wait()
            why = f"was not ready within {READY_S:g}s (killed)"
        else:
            why = how_it_ended(await process.wait())
        self._live.discard(process)
        self.release(process)
        return process, why

    def release(self, process: trio.Process, serve: bool = False) -> None:
        """Tell a worker that is ready to serve, or (closing its pipe) to exit without serving."""
        go = self._held.pop(process, None)
        if go is None:
            return
        if serve:
            with contextlib.suppress(OSError):  # it died meanwhile: its slot starts it again
                os.write(go, b"1")
        os.close(go)

    def discard(self, process: trio.Process) -> None:
        """`process` has exited (its status reaped): nothing to stop any more."""
        self._live.discard(process)

    async def retire(self, process: trio.Process, grace_s: float, serving: bool = True) -> None:
        """Stop a worker whose successor serves (or, not `serving`, one released to exit without
        serving): gracefully, then at once past its grace."""
        if serving:
            process.terminate()
        with trio.move_on_after(grace_s + KILL_AFTER_S):
            await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()
        self._live.discard(process)

    async def stop_all(self, grace_s: float) -> None:
        """Stop every worker: gracefully within `grace_s`, then at once."""
        for process in list(self._held):
            self.release(process)
        live = [p for p in self._live if p.returncode is None]
        if live:
            log.warning("stopping %d workers (in-flight jobs may finish)", len(live))
        for process in live:
            process.terminate()
        with trio.move_on_after(grace_s + KILL_AFTER_S):
            for process in live:
                await process.wait()
        self.kill()
        for process in live:
            await process.wait()

    def kill(self) -> None:
        """Kill every worker still running, at once."""
        for process in self._live:
            if process.returncode is None:
                process.kill()

"""The parent of `lanes serve --workers N`: it starts the workers, starts again the ones that exit,
reloads the config when told to, and stops them all.

- **One config per host.** The parent runs one `WorkerPlan`: the config's bytes in a private copy
  the workers read, and their hash. A worker started again after a crash is started on the plan that
  is running, whatever the file on disk says by then; only a reload reads the file again.
- **A reload is a decision.** SIGHUP (which `POST /v1/reload`, `lanes reload`, sends) makes a new
  plan from the file (`replan`). A file that does not pass its checks, or that changes what a
  reload can not change, is refused — one line says why, naming the key — and the running plan
  stays. Otherwise a new worker is started for every slot beside the old one, on the slot's
  socket, and only when every new worker serves are the old ones stopped gracefully: the port
  never stops answering. One line names the keys that changed. A new worker that is not ready
  within `READY_S` (`processes.py`) refuses the reload: the new ones are stopped, the old ones
  keep serving. A new worker serves nothing until the reload is decided: it says it is ready
  (config checked, dispatcher open) and waits to be told to serve.
- **Restarts back off.** A worker that exits on its own is started again after
  `restart_delay_s`: at once when it had served `STABLE_S`, else 0.5 s doubling to 30 s, per slot.
  The parent never gives up; it exits 1 only when no worker at all could start at start-up.
- **Status.** The parent writes `status.json` beside the config copies whenever what runs changes
  (what each worker runs, whether it serves, the last reload's outcome); the workers read it for
  `/ready`, `/v1/lanes` and `POST /v1/reload` (`running.py`).
- **Processes.** Starting, releasing and stopping a worker process is `processes.py`'s.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import trio

from lanes._core.config.lowering import guard_lowered
from lanes._core.model.errors import ConfigError
from lanes._core.source import changed_keys, said
from lanes._http.processes import Processes, WorkerPlan, how_it_ended

log = logging.getLogger("lanes")
STABLE_S = 60.0  # a worker that served this long and exits is started again at once
FIRST_RESTART_S = 0.5
MAX_RESTART_S = 30.0


def restart_delay_s(failures: int) -> float:
    """Seconds to wait before starting a slot's worker again after `failures` exits in a row that
    came too soon (before serving, or within `STABLE_S`): 0 for none, then 0.5 s doubling, at
    most 30 s."""
    if failures <= 0:
        return 0.0
    return min(FIRST_RESTART_S * 2.0 ** min(failures - 1, 32), MAX_RESTART_S)


def short(sha256: str | None) -> str:
    return (sha256 or "none")[:12]


@attrs.define
class _Slot:
    number: int
    process: trio.Process | None = None
    sha256: str | None = None
    serving: bool = False
    started_at: float = 0.0
    failures: int = 0


def _again(delay_s: float) -> str:
    return f"starting it again in {delay_s:g}s" if delay_s else "starting it again"


def lowered_by(running: WorkerPlan, plan: WorkerPlan) -> list[str]:
    """How `plan`'s config lowers the guard `running`'s holds (`guard_lowered`)."""
    if running.config is None or plan.config is None:
        return []
    return guard_lowered(running.config, plan.config)


def _one_line(exc: ConfigError) -> str:
    return "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())


class Team:
    """The parent's view of its workers. `replan` reads and checks the file again (raises
    `ConfigError`), None when there is nothing to reload (`--simulate`)."""

    def __init__(
        self,
        plan: WorkerPlan,
        *,
        count: int,
        env: Mapping[str, str],
        log_format: str,
        status_path: Path,
        replan: Callable[[], WorkerPlan] | None,
    ) -> None:
        self._plan = plan
        self._status_path, self._replan = status_path, replan
        self._slots = [_Slot(number=n) for n in range(1, count + 1)]
        self._processes = Processes(env=env, log_format=log_format)
        self._lock = trio.Lock()  # one reload or restart starts workers at a time
        self._wanted = trio.Event()
        self._accept_weaker = False  # the reload wanted may lower the guard (SIGUSR1)
        self._stopping = trio.Event()
        self._work = trio.CancelScope()
        self._reloads = 0
        self._last: dict[str, Any] | None = None
        self._code = 0

    async def run(self) -> int:
        async with trio.open_nursery() as outer:
            outer.start_soon(self._signals)
            self._publish()
            with self._work:
                async with trio.open_nursery() as work:
                    if await self._start_all():
                        for slot in self._slots:
                            work.start_soon(self._keep, slot)
                        work.start_soon(self._reloader, work)
                        await trio.sleep_forever()
            await self._processes.stop_all(self._plan.grace_s)
            outer.cancel_scope.cancel()
        return self._code

    def _took(self, slot: _Slot, process: trio.Process, plan: WorkerPlan) -> None:
        """`process` (ready on `plan`) is slot's worker now: it serves from here on."""
        self._processes.release(process, serve=True)
        slot.process, slot.sha256, slot.serving = process, plan.sha256, True
        slot.started_at = trio.current_time()

    async def _start_all(self) -> bool:
        """Start every worker at once; False (and one line) when not one of them serves."""

        def serving(slot: _Slot, process: trio.Process) -> None:
            self._took(slot, process, self._plan)
            self._publish()  # serving: its `/ready` must not call it missing

        started, failed = await self._start_on(self._plan, serving)
        for slot in self._slots:
            slot.failures = 0 if slot.number in started else 1
        self._publish()
        failed.sort(key=lambda line: int(line.split()[1]))  # in worker order, whichever ended first
        if any(slot.serving for slot in self._slots):
            for line in failed:
                log.error("%s; %s (it had not served yet)", line, _again(restart_delay_s(1)))
            return True
        log.error(
            "no worker could start (%s): stopping; the lines above say why", "; ".join(failed)
        )
        self._code = 1
        self._work.cancel()
        return False

    async def _keep(self, slot: _Slot) -> None:
        """Slot `slot.number`: when its worker exits on its own, start it again — on the running
        plan, after `restart_delay_s`."""
        while True:
            if slot.serving and slot.process is not None:
                process = slot.process
                status = await process.wait()
                self._processes.discard(process)
                if slot.process is not process:
                    continue  # retired by a reload: its successor serves
                lived_s = trio.current_time() - slot.started_at
                slot.failures = 0 if lived_s >= STABLE_S else slot.failures + 1
                slot.serving = False
                self._publish()
                log.error(
                    "worker %d (pid %d) %s; %s",
                    slot.number,
                    process.pid,
                    how_it_ended(status),
                    _again(restart_delay_s(slot.failures)),
                )
            await trio.sleep(restart_delay_s(slot.failures))
            async with self._lock:
                if slot.serving:
                    continue  # a reload started it meanwhile
                process, why = await self._processes.start(slot.number, self._plan)
                if why is None:
                    self._took(slot, process, self._plan)
                    self._publish()
                    continue
                slot.failures += 1
                log.error(
                    "worker %d (pid %d) %s; %s (it had not served yet)",
                    slot.number,
                    process.pid,
                    why,
                    _again(restart_delay_s(slot.failures)),
                )

    async def _reloader(self, work: trio.Nursery) -> None:
        while True:
            await self._wanted.wait()
            self._wanted = trio.Event()  # SIGHUPs during a reload: one more reload after it
            accept_weaker, self._accept_weaker = self._accept_weaker, False
            await self._reload(work, accept_weaker=accept_weaker)

    async def _reload(self, work: trio.Nursery, *, accept_weaker: bool = False) -> None:
        running = self._plan
        if self._replan is None:
            self._reloaded(False, "reload refused: --simulate runs its built-in config")
            return
        try:
            plan = self._replan()
        except ConfigError as exc:
            self._reloaded(False, f"reload refused: {_one_line(exc)}")
            return
        if plan.sha256 == running.sha256:
            self._unlink(plan)
            self._reloaded(True, f"config unchanged ({short(plan.sha256)}): nothing to reload")
            return
        lowered = lowered_by(running, plan)
        if lowered and not accept_weaker:
            self._unlink(plan)
            self._reloaded(
                False,
                f"reload refused: it would lower the guard ({'; '.join(lowered)}); "
                "`lanes reload --accept-weaker` applies it (or restart the sidecar on it)",
            )
            return
        async with self._lock:
            started, failed = await self._start_on(plan)
            if failed:  # those that are ready never serve: they exit on their own
                for process in started.values():
                    self._processes.release(process)
                    work.start_soon(self._processes.retire, process, plan.grace_s, False)
                self._unlink(plan)
                self._reloaded(
                    False, f"reload refused: a worker could not start on it ({'; '.join(failed)})"
                )
                return
            old = [s.process for s in self._slots if s.process is not None]
            for slot in self._slots:
                self._took(slot, started[slot.number], plan)
                slot.failures = 0
            self._plan = plan
            changes = said(changed_keys(running.raw or {}, plan.raw or {}))
            weaker = f"; the guard lowered, as confirmed: {'; '.join(lowered)}" if lowered else ""
            self._reloaded(
                True,
                f"config reloaded: {short(running.sha256)} → {short(plan.sha256)}; {changes} "
                f"({len(self._slots)} workers started on it, the old ones stop gracefully)"
                + weaker,
            )
            for process in old:
                if process.returncode is None:
                    work.start_soon(self._processes.retire, process, running.grace_s)
            self._unlink(running)

    async def _start_on(
        self, plan: WorkerPlan, ready: Callable[[_Slot, trio.Process], None] | None = None
    ) -> tuple[dict[int, trio.Process], list[str]]:
        """A new worker on `plan` per slot, all at once: those ready by slot (each told to `ready`
        as it is), a line per failure."""
        started: dict[int, trio.Process] = {}
        failed: list[str] = []

        async def one(slot: _Slot) -> None:
            process, why = await self._processes.start(slot.number, plan)
            if why is None:
                started[slot.number] = process
                if ready is not None:
                    ready(slot, process)
                return
            failed.append(f"worker {slot.number} (pid {process.pid}) {why}")

        async with trio.open_nursery() as nursery:
            for slot in self._slots:
                nursery.start_soon(one, slot)
        return started, failed

    def _reloaded(self, ok: bool, message: str) -> None:
        """The outcome of a reload: one line, and the status file (what `POST /v1/reload`
        answers)."""
        (log.warning if ok else log.error)(
            "%s", message if ok else f"{message}; still running {short(self._plan.sha256)}"
        )
        self._reloads += 1
        self._last = {"ok": ok, "message": message, "sha256": self._plan.sha256}
        self._publish()

    def _unlink(self, plan: WorkerPlan) -> None:
        if plan.file is not None:
            with contextlib.suppress(OSError):
                plan.file.unlink()

    def _publish(self) -> None:
        """Write the status file whole, then rename it into place (a reader sees one or the
        other)."""
        status = {
            "sha256": self._plan.sha256,
            "workers": [
                {
                    "worker": slot.number,
                    "pid": slot.process.pid if slot.process is not None else None,
                    "sha256": slot.sha256,
                    "serving": slot.serving,
                }
                for slot in self._slots
            ],
            "reloads": self._reloads,
            "last_reload": self._last,
        }
        fresh = self._status_path.with_suffix(".new")
        fresh.write_text(json.dumps(status))
        fresh.replace(self._status_path)

    async def _signals(self) -> None:
        """SIGINT/SIGTERM: stop the workers gracefully; a second one: at once. SIGHUP: reload;
        SIGUSR1: reload, accepting a config that lowers the guard (`reload --accept-weaker`)."""
        wanted = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)
        with trio.open_signal_receiver(*wanted) as signals:
            async for signum in signals:
                if signum in (signal.SIGHUP, signal.SIGUSR1):
                    self._accept_weaker = self._accept_weaker or signum == signal.SIGUSR1
                    self._wanted.set()
                    continue
                if not self._stopping.is_set():
                    self._stopping.set()
                    self._work.cancel()
                    continue
                log.warning("stopping the workers at once")
                self._processes.kill()

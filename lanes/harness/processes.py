"""Child processes for drills, tests and benchmarks that need the real thing: `lanes serve`
(to kill, restart or re-import it), and job processes that import the dispatcher."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import trio


def toml_key(key: str) -> str:
    """A bare key when TOML allows one, else a quoted one (`"claude-*"`)."""
    bare = key and all(c.isascii() and (c.isalnum() or c in "-_") for c in key)
    return key if bare else json.dumps(key)


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(value)


def dump_toml(config: Mapping[str, Any]) -> str:
    """TOML for a config mapping: scalars and inline tables at the top, then [table]s and
    [[lanes]]."""
    lines, tables = [], []
    for key, value in config.items():
        if key == "lanes":
            continue
        if (
            isinstance(value, dict)
            and any(isinstance(v, dict) for v in value.values())
            or key in ("policy", "server")
        ):
            tables.append((key, value))
        else:
            lines.append(f"{key} = {toml_value(value)}")
    for key, table in tables:
        lines.append(f"[{key}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in table.items()]
    for lane in config.get("lanes", []):
        lines.append("[[lanes]]")
        lines += [f"{k} = {toml_value(v)}" for k, v in lane.items() if k != "models"]
        for model in lane.get("models", []):
            lines.append("[[lanes.models]]")
            lines += [f"{k} = {toml_value(v)}" for k, v in model.items()]
    return "\n".join(lines) + "\n"


_ONLY_THE_COPY = (
    "import runpy, sys; "
    "sys.meta_path[:] = [f for f in sys.meta_path "
    "if 'editable' not in getattr(f, '__module__', '').lower()]; "
    "sys.argv[0] = 'lanes'; runpy.run_module('lanes', run_name='__main__', alter_sys=True)"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class SidecarProcess:
    def __init__(
        self, process: trio.Process, base: str, log_path: Path, config_path: Path | None = None
    ) -> None:
        self.process, self.base, self.log_path = process, base, log_path
        self.config_path = config_path  # the TOML it was started with (to edit on disk)
        self.health_s = 0.0  # seconds from spawn to the first /health answer (0 until then)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def rewrite(self, config: Mapping[str, Any] | str) -> None:
        """Write the config file anew (on its own port), as an operator editing it would; a
        string is written as it is (say, TOML cut mid-edit)."""
        assert self.config_path is not None
        if not isinstance(config, str):
            port = int(self.base.rsplit(":", 1)[1])
            config = dump_toml({**config, "server": {**config.get("server", {}), "port": port}})
        self.config_path.write_text(config)

    async def every_worker(self, count: int, *, timeout_s: float = 10.0) -> dict[int, Any]:
        """What each of `count` workers (`--workers N`) answers at `/v1/lanes`, by the worker
        number it names, asking on new connections until each has answered."""
        found: dict[int, Any] = {}
        limits = httpx2.Limits(max_keepalive_connections=0)
        async with httpx2.AsyncClient(trust_env=False, timeout=timeout_s, limits=limits) as http:
            for _ in range(200):
                body = (await http.get(f"{self.base}/v1/lanes")).json()
                found.setdefault(body["config"]["worker"], body)
                if len(found) == count:
                    return found
        raise RuntimeError(f"only workers {sorted(found)} of {count} answered in 200 connections")

    async def until_every_worker(
        self,
        count: int,
        check: Callable[[dict[int, Any]], bool],
        within_s: float = 30.0,
    ) -> dict[int, Any]:
        """`every_worker(count)` once `check` holds of it — say, a reload's terms in force, which
        the workers take from the state store at their next sync once the old workers have left
        — asked every 50 ms; RuntimeError, with what was seen and the log's end, when it does not
        within `within_s`. A round that does not finish within 2 s (a connection handed to a
        worker that is starting or leaving) is asked again."""
        views: dict[int, Any] = {}
        rounds = slow = 0
        with trio.move_on_after(within_s):
            while True:
                rounds += 1
                try:
                    with trio.fail_after(2.0):
                        views = await self.every_worker(count, timeout_s=2.0)
                except (trio.TooSlowError, httpx2.TransportError):
                    slow += 1
                    continue
                if check(views):
                    return views
                await trio.sleep(0.05)
        seen = [(v["paid"], v.get("clock", {}).get("hosts")) for v in views.values()]
        raise RuntimeError(
            f"the workers' views did not come to pass in {rounds} rounds ({slow} slow): {seen}; "
            f"log: {self.log()[-3000:]}"
        )

    async def host(self, key: str | None = None) -> dict[str, Any]:
        """The parent's view of its workers (`/v1/lanes`' `config.host`; asked with `key` when
        the config names client keys)."""
        headers = {"authorization": f"Bearer {key}"} if key else {}
        async with httpx2.AsyncClient(trust_env=False, timeout=10) as http:
            view = (await http.get(f"{self.base}/v1/lanes", headers=headers)).json()
        host: dict[str, Any] = view["config"]["host"]
        return host

    async def until_host(
        self,
        check: Callable[[dict[str, Any]], bool],
        within_s: float = 30.0,
        key: str | None = None,
    ) -> dict[str, Any]:
        """The parent's view once `check` holds of it (it is a file the parent writes: asked
        every 20 ms); RuntimeError when it does not within `within_s`, or the parent exits."""
        with trio.move_on_after(within_s):
            while self.process.returncode is None:
                with contextlib.suppress(httpx2.TransportError):
                    if check(host := await self.host(key)):
                        return host
                await trio.sleep(0.02)
        raise RuntimeError(f"the parent's view did not come to pass: {self.log()[-2000:]}")

    def children(self) -> list[int]:
        """The pids of the process's children — the workers of `--workers N` (Linux)."""
        found = []
        for task in Path(f"/proc/{self.process.pid}/task").glob("*"):  # whichever thread forked
            try:
                found += [int(child) for child in (task / "children").read_text().split()]
            except OSError:
                continue
        return sorted(found)

    async def wait_healthy(self, within_s: float = 60.0) -> float:
        """Seconds until /health answered 200. The bound is wide: a loaded machine starts three
        workers slowly; a sidecar that never answers still fails, and one that exits at once."""
        start = time.monotonic()  # wall-clock: a drill measures real startup time
        async with httpx2.AsyncClient(trust_env=False) as http:
            while time.monotonic() - start < within_s:  # wall-clock: as above
                if self.process.returncode is not None:
                    raise RuntimeError(
                        f"sidecar exited with {self.process.returncode}: {self.log()[-2000:]}"
                    )
                try:
                    if (await http.get(f"{self.base}/health", timeout=0.25)).status_code == 200:
                        self.health_s = time.monotonic() - start  # wall-clock: as above
                        return self.health_s
                except httpx2.TransportError:
                    await trio.sleep(0.01)
        raise RuntimeError(f"/health did not answer within {within_s}s: {self.log()[-2000:]}")


@asynccontextmanager
async def open_sidecar_process(
    config: Mapping[str, Any],
    workdir: Path,
    *,
    env: Mapping[str, str] | None = None,
    pythonpath: str | None = None,
    port: int | None = None,
    args: Sequence[str] = (),
) -> AsyncIterator[SidecarProcess]:
    """Write `config` as TOML, start `python -m lanes serve` on it (and `args`, say `--workers 2`),
    wait for /health, yield it.

    With `pythonpath` (a copy of the package) the child imports `lanes` from there only: a
    development (editable) install's import hook is removed first, or it would quietly find a
    module deleted from the copy in the work tree — which no real installation would do.
    """
    port = port or free_port()
    path = workdir / "lanes.toml"
    path.write_text(dump_toml({**config, "server": {**config.get("server", {}), "port": port}}))
    log_path = workdir / f"sidecar-{port}.log"
    child_env = {**os.environ, **(env or {})}
    if pythonpath:
        child_env["PYTHONPATH"] = pythonpath
    log_file = await trio.to_thread.run_sync(log_path.open, "wb")
    with log_file:
        command = [sys.executable, "-m", "lanes", "serve", "--config", str(path), *args]
        if pythonpath:
            command[1:3] = ["-c", _ONLY_THE_COPY]
        process = await trio.lowlevel.open_process(
            command, stdout=log_file, stderr=subprocess.STDOUT, env=child_env, cwd=str(workdir)
        )
        sidecar = SidecarProcess(process, f"http://127.0.0.1:{port}", log_path, path)
        try:
            await sidecar.wait_healthy()
            yield sidecar
        finally:
            await stop(process)


@asynccontextmanager
async def open_sidecar_processes(
    config: Mapping[str, Any],
    workdir: Path,
    *,
    count: int = 2,
    env: Mapping[str, str] | None = None,
) -> AsyncIterator[list[SidecarProcess]]:
    """`count` sidecar processes on one config (say, a Redis `state`), each in its own directory
    with its own `local_state` — several hosts, on loopback."""
    async with AsyncExitStack() as stack:
        sidecars = []
        for i in range(count):
            folder = workdir / f"host-{i}"
            folder.mkdir(parents=True, exist_ok=True)
            own = {**config, "local_state": str(folder / "local.db")}
            sidecars.append(
                await stack.enter_async_context(open_sidecar_process(own, folder, env=env))
            )
        yield sidecars


@asynccontextmanager
async def open_sidecar_processes_at_once(
    specs: Sequence[tuple[Mapping[str, Any], Path]],
    *,
    env: Mapping[str, str] | None = None,
) -> AsyncIterator[list[SidecarProcess]]:
    """Sidecar processes, one per (config, directory), spawned at the same moment and yielded once
    each answers /health: their `health_s` were measured under the same load, so one can be the
    other's baseline."""
    sidecars: dict[int, SidecarProcess] = {}
    leave = trio.Event()

    async def hold(
        i: int, config: Mapping[str, Any], workdir: Path, *, task_status: trio.TaskStatus[None]
    ) -> None:
        async with open_sidecar_process(config, workdir, env=env) as sidecar:
            sidecars[i] = sidecar
            task_status.started()
            await leave.wait()

    async with trio.open_nursery() as nursery:
        async with trio.open_nursery() as starting:
            for i, (config, workdir) in enumerate(specs):
                starting.start_soon(functools.partial(nursery.start, hold, i, config, workdir))
        try:
            yield [sidecars[i] for i in range(len(specs))]
        finally:
            leave.set()


async def stop(process: trio.Process, grace_s: float = 10.0) -> None:
    """SIGTERM, wait up to `grace_s` for a graceful exit, then SIGKILL."""
    if process.returncode is None:
        process.terminate()
        with trio.move_on_after(grace_s):
            await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()


class JobProcesses:
    """Processes that import the dispatcher (`python -m lanes.harness.herd`), started by
    `open_job_processes`, each ready to send a round of jobs when told."""

    def __init__(self, processes: list[trio.Process], outputs: list[Path], go: Path) -> None:
        self.processes, self._outputs, self._go = processes, outputs, go

    def _lines(self, i: int) -> list[str]:
        return self._outputs[i].read_text(errors="replace").splitlines()

    async def wait_ready(self, within_s: float = 30.0) -> None:
        with trio.fail_after(within_s):
            while not all("ready" in self._lines(i) for i in range(len(self.processes))):
                for i, process in enumerate(self.processes):
                    if process.returncode is not None:
                        raise RuntimeError(f"job process exited: {self._outputs[i].read_text()}")
                await trio.sleep(0.02)

    def start(self, round_: int = 1) -> None:
        """Start round `round_` in every process at once."""
        Path(f"{self._go}.{round_}").touch()

    async def outcomes(self, round_: int = 1, within_s: float = 60.0) -> list[dict[str, int]]:
        """Each process's outcomes of round `round_` ({"ok" | error code: count}), once all are
        done."""
        found: list[dict[str, int] | None] = [None] * len(self.processes)
        with trio.fail_after(within_s):
            while any(f is None for f in found):
                for i in range(len(self.processes)):
                    for line in self._lines(i):
                        try:
                            said = json.loads(line) if line.startswith("{") else None
                        except ValueError:  # a line still being written
                            continue
                        if isinstance(said, dict) and said.get("round") == round_:
                            found[i] = said["outcomes"]
                await trio.sleep(0.02)
        return [f or {} for f in found]


@asynccontextmanager
async def open_job_processes(
    config: Mapping[str, Any],
    workdir: Path,
    *,
    count: int = 2,
    jobs: int = 50,
    rounds: int = 1,
    model: str = "auto",
    deadline_s: float = 10.0,
    env: Mapping[str, str] | None = None,
) -> AsyncIterator[JobProcesses]:
    """`count` job processes on `config` (say, one SQLite `state` file shared with a sidecar),
    each opening its own dispatcher; yields them ready (`start(r)`, then `outcomes(r)`)."""
    await trio.Path(workdir).mkdir(parents=True, exist_ok=True)
    path = workdir / f"jobs-{free_port()}.toml"
    await trio.Path(path).write_text(dump_toml(config))
    go = workdir / f"{path.stem}.go"
    child_env = {**os.environ, **(env or {})}
    outputs = [workdir / f"{path.stem}-{i}.out" for i in range(count)]
    processes: list[trio.Process] = []
    try:
        for output in outputs:
            out = await trio.to_thread.run_sync(output.open, "wb")
            with out:
                command = [sys.executable, "-m", "lanes.harness.herd", str(path)]
                command += ["--jobs", str(jobs), "--rounds", str(rounds), "--model", model]
                command += ["--deadline-s", str(deadline_s), "--go", str(go)]
                process = await trio.lowlevel.open_process(
                    command, stdout=out, stderr=subprocess.STDOUT, env=child_env
                )
                processes.append(process)
        herd = JobProcesses(processes, outputs, go)
        await herd.wait_ready()
        yield herd
    finally:
        for process in processes:
            await stop(process)

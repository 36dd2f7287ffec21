"""Start and stop the processes a benchmark compares: fake upstream, ours, the limit, the floor,
LiteLLM and the Portkey gateway."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import trio

from lanes.harness.processes import dump_toml, free_port, stop

ROOT = Path(__file__).resolve().parent.parent
LITELLM = ROOT / "bench" / ".venv-litellm" / "bin" / "litellm"
#: The Portkey gateway, installed by `make bench` (npm ci of bench/portkey/ into bench/.portkey).
PORTKEY = ROOT / "bench" / ".portkey"
PORTKEY_SERVER = PORTKEY / "node_modules" / "@portkey-ai" / "gateway" / "build" / "start-server.js"
NODE_MAJOR = 20  # the Node the gateway is run with (its own CI's)


def tree_pids(pid: int) -> list[int]:
    """`pid` and its children (whichever of its threads forked them)."""
    pids = [pid]
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            pids += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return pids


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system: every thread's, those that ended too) process `pid` has used
    so far, from its CPU clock, to the nanosecond. /proc's figure comes in ticks of 10 ms — a cell
    of 80 requests read ±0.125 ms per request — and is the fallback where the kernel will not give
    another process's clock. Raises `ProcessLookupError` once the process is gone (a figure of 0
    would make a CPU difference negative)."""
    try:
        # glibc's clock_getcpuclockid(pid): MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)
        return time.clock_gettime(((~pid) << 3) | 2)
    except OSError:
        pass
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        raise ProcessLookupError(f"process {pid} is gone") from None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_s(pid: int) -> float:
    """CPU seconds `pid` and its live children have used so far (a child gone between the
    listing and the reading counts nothing)."""
    total = 0.0
    for one in tree_pids(pid):
        with contextlib.suppress(ProcessLookupError):
            total += process_cpu_s(one)
    return total


class Peer:
    def __init__(
        self,
        name: str,
        url: str,
        process: trio.Process | None,
        headers: dict[str, str] | None = None,
    ):
        self.name, self.url, self.process, self.headers = name, url, process, headers or {}
        self.started_s: float | None = None

    def pids(self) -> list[int]:
        """The peer's process and its children (LiteLLM's proxy may run its server in one)."""
        return [] if self.process is None else tree_pids(self.process.pid)

    def own_cpu_s(self) -> float:
        """CPU seconds (user + system) the peer's own process has used so far, its children not
        counted."""
        assert self.process is not None
        return process_cpu_s(self.process.pid)

    def cpu_s(self) -> float:
        """CPU seconds (user + system) the peer's process and its children have used so far."""
        return 0.0 if self.process is None else tree_cpu_s(self.process.pid)

    def rss_mb(self) -> float | None:
        """Resident memory of the peer's process (and its children), in MiB."""
        if self.process is None:
            return None
        total = 0
        for pid in self.pids():
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
            except OSError:
                continue
        return total / 1024


async def wait_http(
    url: str,
    within_s: float,
    *,
    path: str = "/health",
    headers: dict[str, str] | None = None,
    ok: tuple[int, ...] = (200,),
) -> float:
    start = time.monotonic()  # wall-clock: startup is measured in real time
    async with httpx2.AsyncClient(trust_env=False) as http:
        while time.monotonic() - start < within_s:  # wall-clock: as above
            try:
                if (await http.get(url + path, timeout=0.5, headers=headers)).status_code in ok:
                    return time.monotonic() - start  # wall-clock: as above
            except httpx2.TransportError:
                pass
            await trio.sleep(0.01)
    raise RuntimeError(f"{url}{path} did not answer within {within_s}s")


@asynccontextmanager
async def spawn(
    command: list[str], log: Path, env: dict[str, str] | None = None
) -> AsyncIterator[trio.Process]:
    with open(log, "wb") as out:  # noqa: ASYNC230  small local log; the child needs a real fd
        process = await trio.lowlevel.open_process(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            cwd=str(ROOT),
        )
        try:
            yield process
        finally:
            await stop(process)


@asynccontextmanager
async def fake_upstream(behaviour: str, workdir: Path) -> AsyncIterator[tuple[str, Path]]:
    port = free_port()
    log = workdir / f"fake-{behaviour}-{port}.json"
    async with spawn(
        [sys.executable, "-m", "bench.fake_upstream", str(port), behaviour, "--log", str(log)],
        workdir / f"fake-{port}.out",
    ):
        await wait_http(f"http://127.0.0.1:{port}", 15, path="/v1/models")
        yield f"http://127.0.0.1:{port}/v1", log


def ours_config(
    upstream: str,
    *,
    kind: str = "rate_limited",
    timeout_s: float = 30.0,
    models: tuple[str, ...] = ("m",),
    extra: dict[str, Any] | None = None,
    state: str = ":memory:",
    policy: dict[str, Any] | None = None,
    model_extra: dict[str, Any] | None = None,
    cache: bool = False,
) -> dict[str, Any]:
    """Our config for one lane `up` on the shared upstream (also what job processes open), with
    the response cache on when `cache`."""
    return {
        **({"cache": {"mode": "on"}} if cache else {}),
        "state": state,
        "local_state": ":memory:",
        "default_deadline_s": timeout_s,
        "policy": policy or {"free_tier_fallback": "off"},
        "lanes": [
            {
                "name": "up",
                "module": "openai_compatible",
                "base_url": upstream,
                "api_key_env": "",
                "free_tier": {"kind": kind},
                "attempt_timeout_s": timeout_s,
                "first_token_s": timeout_s,
                "models": [{"id": m, **(model_extra or {})} for m in models],
                **(extra or {}),
            }
        ],
    }


@asynccontextmanager
async def ours(
    upstream: str, workdir: Path, *, workers: int = 1, **options: Any
) -> AsyncIterator[Peer]:
    """`lanes serve` on `ours_config(upstream, **options)`, with `--workers` when more than one."""
    port = free_port()
    config = ours_config(upstream, **options)
    path = workdir / f"ours-{port}.toml"
    path.write_text(dump_toml({**config, "server": {"port": port}}))
    start = time.monotonic()  # wall-clock: startup is measured in real time
    command = [sys.executable, "-m", "lanes", "serve", "--config", str(path)]
    async with spawn(
        command + (["--workers", str(workers)] if workers > 1 else []),
        workdir / f"ours-{port}.log",
    ) as p:
        await wait_http(f"http://127.0.0.1:{port}", 30, path="/ready", ok=(200, 503))
        name = "lanes" if workers == 1 else f"lanes-w{workers}"
        peer = Peer(name, f"http://127.0.0.1:{port}/v1", p)
        peer.started_s = time.monotonic() - start  # wall-clock: as above
        yield peer


def limit(upstream: str, workdir: Path) -> AbstractAsyncContextManager[Peer]:
    """The stack's best: a bare pass-through (`bench/passthrough.py`)."""
    return _proxy("limit", "bench.passthrough", upstream, workdir)


def floor(upstream: str, workdir: Path, *, fast: bool = False) -> AbstractAsyncContextManager[Peer]:
    """The least any router must do on our stack (`bench/floor.py`); `fast`: its JSON read and
    written by msgspec (`floor-msgspec`)."""
    if fast:
        return _proxy("floor-msgspec", "bench.floor", upstream, workdir, "--msgspec")
    return _proxy("floor", "bench.floor", upstream, workdir)


@asynccontextmanager
async def _proxy(
    name: str, module: str, upstream: str, workdir: Path, *options: str
) -> AsyncIterator[Peer]:
    port = free_port()
    async with spawn(
        [sys.executable, "-m", module, str(port), upstream, *options],
        workdir / f"{name}-{port}.log",
    ) as p:
        await wait_http(f"http://127.0.0.1:{port}", 30, path="/", ok=(200, 400, 404, 405, 500))
        yield Peer(name, f"http://127.0.0.1:{port}/v1", p)


def litellm_available() -> bool:
    return LITELLM.exists()


@asynccontextmanager
async def litellm(
    upstream: str,
    workdir: Path,
    *,
    timeout_s: float = 30.0,
    models: dict[str, float] | None = None,
    workers: int = 1,
    provider: str = "openai",
) -> AsyncIterator[Peer]:
    """LiteLLM's proxy routing each model name (→ its timeout in seconds) to the same upstream,
    with `--num_workers workers`, as LiteLLM's `provider`: `openai`, or `custom_openai` — an
    OpenAI-compatible server, whose Responses requests LiteLLM translates to chat completions (to
    `openai` it passes them to the upstream's own /responses). Its Messages door is told to
    translate to chat completions too (not to OpenAI's Responses API, its default for `openai`)."""
    port = free_port()
    key = "sk-bench-" + secrets.token_hex(8)
    config = workdir / f"litellm-{port}.yaml"
    entries = "".join(
        f"  - model_name: {name}\n    litellm_params:\n      model: {provider}/{name}\n"
        f"      api_base: {upstream}\n      api_key: bench\n      timeout: {timeout}\n"
        for name, timeout in (models or {"m": timeout_s}).items()
    )
    config.write_text("model_list:\n" + entries + "litellm_settings:\n  drop_params: true\n")
    env = {
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_MASTER_KEY": key,
        "LITELLM_LOG": "ERROR",
        "DISABLE_SCHEMA_UPDATE": "true",
        "NO_DOCS": "True",
        "LITELLM_USE_CHAT_COMPLETIONS_URL_FOR_ANTHROPIC_MESSAGES": "True",
    }
    start = time.monotonic()  # wall-clock: startup is measured in real time
    async with spawn(
        [str(LITELLM), "--config", str(config), "--port", str(port)]
        + ["--num_workers", str(workers)],
        workdir / f"litellm-{port}.log",
        env,
    ) as p:
        await wait_http(f"http://127.0.0.1:{port}", 120, path="/health/liveliness")
        name = "litellm" if workers == 1 else f"litellm-w{workers}"
        peer = Peer(name, f"http://127.0.0.1:{port}/v1", p, {"Authorization": f"Bearer {key}"})
        peer.started_s = time.monotonic() - start  # wall-clock: as above
        yield peer


def portkey_missing() -> str | None:
    """Why the Portkey gateway can not run here (None: it can): no Node, an older one, or npm
    could not install it (`make bench` installs it into bench/.portkey)."""
    node = shutil.which("node")
    if node is None:
        return "node is not installed"
    out = subprocess.run([node, "--version"], capture_output=True, text=True, check=False)
    major = out.stdout.strip().lstrip("v").split(".")[0]
    if not major.isdigit() or int(major) < NODE_MAJOR:
        return f"node {out.stdout.strip() or '?'} is older than {NODE_MAJOR}"
    failed = PORTKEY / "npm-failed"
    if failed.exists():
        return failed.read_text().strip()
    if not PORTKEY_SERVER.exists():
        return "not installed (make bench installs it into bench/.portkey with npm)"
    return None


@asynccontextmanager
async def portkey(upstream: str, workdir: Path) -> AsyncIterator[Peer]:
    """The Portkey gateway (Node, its own process) on 127.0.0.1, sending every request to the
    upstream as an OpenAI-compatible provider (`x-portkey-custom-host`)."""
    port = free_port()
    command = [
        shutil.which("node") or "node",
        str(ROOT / "bench" / "portkey" / "loopback.mjs"),
        str(PORTKEY_SERVER),
        f"--port={port}",
        "--headless",
    ]
    start = time.monotonic()  # wall-clock: startup is measured in real time
    async with spawn(command, workdir / f"portkey-{port}.log") as p:
        await wait_http(f"http://127.0.0.1:{port}", 60, path="/", ok=(200, 404))
        headers = {
            "x-portkey-provider": "openai",
            "x-portkey-custom-host": upstream,
            "Authorization": "Bearer bench",
        }
        peer = Peer("portkey", f"http://127.0.0.1:{port}/v1", p, headers)
        peer.started_s = time.monotonic() - start  # wall-clock: as above
        yield peer


def commit() -> str:
    """The checkout's commit (short), as a run's figures record it: read when the run starts."""
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    )
    return done.stdout.strip()


def version(name: str) -> str:
    if name == "portkey":
        found = PORTKEY_SERVER.parent.parent / "package.json"
        return json.loads(found.read_text())["version"] if found.exists() else "?"
    if name == "litellm":
        out = subprocess.run(
            [
                str(LITELLM.parent / "python"),
                "-c",
                "import importlib.metadata as m;print(m.version('litellm'))",
            ],
            capture_output=True,
            text=True,
        )
        return out.stdout.strip() or "?"
    import importlib.metadata as metadata

    try:  # lanes is distributed as lanes-router
        return metadata.version("lanes-router" if name == "lanes" else name)
    except metadata.PackageNotFoundError:
        return "?"

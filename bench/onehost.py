"""Several processes on one host sharing one SQLite state file: the thundering herd through
`lanes serve --workers 2`, and through a sidecar plus two job processes that import the dispatcher
— upstream requests per Retry-After window — and what the cross-process look costs a job.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx2
import trio

from bench import peers
from bench.load import run_load
from lanes.harness.processes import open_job_processes

WINDOW_S = 5.0  # the fake upstream's Retry-After for the `ratelimit` model
BODY = {"model": "up/ratelimit", "messages": [{"role": "user", "content": "Benchmark: herd."}]}


async def _log(upstream: str) -> list[tuple[str, float]]:
    async with httpx2.AsyncClient(trust_env=False) as http:
        return [tuple(x) for x in (await http.get(upstream + "/_log")).json()]


def per_window(times: list[float]) -> list[int]:
    """Upstream requests in each Retry-After window from the first one on."""
    if not times:
        return []
    first = min(times)
    counts = [0] * (int((max(times) - first) // WINDOW_S) + 1)
    for t in times:
        counts[int((t - first) // WINDOW_S)] += 1
    return counts


async def herd_workers(upstream: str, workdir: Path, workers: int = 2) -> dict[str, Any]:
    """200 clients at once at `lanes serve --workers N` (one state file, which the workers share)
    against 429 + Retry-After: 5."""
    state = str(workdir / f"herd-w{workers}.db")
    async with peers.ours(
        upstream, workdir, workers=workers, models=("ratelimit",), state=state
    ) as p:
        before = len(await _log(upstream))
        samples, _ = await run_load(
            p.url + "/chat/completions", concurrency=200, total=200, body=BODY
        )
        times = [t for m, t in (await _log(upstream))[before:] if m == "ratelimit"]
    windows = per_window(times)
    return {
        "workers": workers,
        "clients": 200,
        "upstream_requests_per_window": windows,
        "upstream_requests_in_window": windows[0] if windows else 0,
        "upstream_requests": len(times),
        "client_statuses": sorted({s.status for s in samples}),
    }


async def herd_sidecar_and_jobs(
    upstream: str, workdir: Path, jobs: int = 2, per_process: int = 100
) -> dict[str, Any]:
    """One `lanes serve` and `jobs` job processes on one SQLite state file, all at once: 200 HTTP
    clients at the sidecar and `per_process` jobs in each job process, against 429 +
    Retry-After: 5."""
    state = str(workdir / "herd-jobs.db")
    config = peers.ours_config(upstream, models=("ratelimit",), state=state)
    async with (
        peers.ours(upstream, workdir, models=("ratelimit",), state=state) as p,
        open_job_processes(
            config, workdir / "herd-jobs", count=jobs, jobs=per_process, model="up/ratelimit"
        ) as herd,
    ):
        before = len(await _log(upstream))
        herd.start(1)
        samples, _ = await run_load(
            p.url + "/chat/completions", concurrency=200, total=200, body=BODY
        )
        outcomes = await herd.outcomes(1)
        times = [t for m, t in (await _log(upstream))[before:] if m == "ratelimit"]
    windows = per_window(times)
    return {
        "sidecars": 1,
        "job_processes": jobs,
        "jobs": 200 + jobs * per_process,
        "upstream_requests_per_window": windows,
        "upstream_requests_in_window": windows[0] if windows else 0,
        "upstream_requests": len(times),
        "client_statuses": sorted({s.status for s in samples}),
        "job_outcomes": sorted({code for o in outcomes for code in o}),
    }


def look_cost(workdir: Path, n: int = 20_000) -> dict[str, Any]:
    """What a job's gate pays to see what other processes wrote (µs per call, one thread): the look
    when nothing changed (one `pread` of the change word), the look after another process wrote a
    backoff (the word, then the backoff and switch tables), and that write itself."""
    from lanes._core.freetier.backoff import Backoff
    from lanes._core.state.store import SQLiteStore

    path = str(workdir / "look.db")
    mine, other = SQLiteStore(path), SQLiteStore(path)
    now = time.time()
    mine.peek(now)
    runs: dict[str, list[float]] = {"unchanged_us": [], "changed_us": [], "write_us": []}
    for _ in range(3):
        start = time.perf_counter()  # wall-clock: a micro-benchmark
        for _ in range(n):
            mine.peek(now)
        runs["unchanged_us"].append((time.perf_counter() - start) / n * 1e6)  # wall-clock: as above
        writes, looks = 0.0, 0.0
        for i in range(n // 20):
            backoff = Backoff(until=now + 60 + i, step=1, reason="rate_limited", source="bench")
            start = time.perf_counter()  # wall-clock: as above
            other.put_backoffs({f"up/m{i % 7}": backoff}, now)
            middle = time.perf_counter()  # wall-clock: as above
            mine.peek(now)
            writes += middle - start
            looks += time.perf_counter() - middle  # wall-clock: as above
        runs["write_us"].append(writes / (n // 20) * 1e6)
        runs["changed_us"].append(looks / (n // 20) * 1e6)
    mine.close()
    other.close()
    return {key: statistics.median(values) for key, values in runs.items()}


async def measure(upstream: str, workdir: Path) -> dict[str, Any]:
    print("bench: one host, several processes (herd) …", file=sys.stderr, flush=True)
    return {
        "herd_workers": await herd_workers(upstream, workdir),
        "herd_sidecar_and_jobs": await herd_sidecar_and_jobs(upstream, workdir),
        "look": await trio.to_thread.run_sync(look_cost, workdir),
    }


def report(r: dict[str, Any] | None) -> list[str]:
    """docs/benchmarks.md's section for these figures."""
    if not r:
        return []
    w, j, look = r["herd_workers"], r["herd_sidecar_and_jobs"], r["look"]
    return [
        "",
        "## Several processes on one host, one SQLite state file",
        "",
        "The herd again (the upstream answering 429 + Retry-After: 5), through processes that",
        "share the host's state file: the probe lease is a row in it, and a backoff one process",
        "writes is seen by the others before their next attempt.",
        "",
        "| processes | jobs at once | upstream requests per 5 s window | in all | statuses |",
        "|---|---|---|---|---|",
        f"| `lanes serve --workers {w['workers']}` | {w['clients']} | "
        f"{w['upstream_requests_per_window']} | {w['upstream_requests']} | "
        f"{w['client_statuses']} |",
        f"| one `lanes serve` + {j['job_processes']} job processes | {j['jobs']} | "
        f"{j['upstream_requests_per_window']} | {j['upstream_requests']} | "
        f"{j['client_statuses']} {j['job_outcomes']} |",
        "",
        "What a job's gate pays to see other processes' writes (µs per call, one thread): "
        f"{look['unchanged_us']:.2f} when nothing changed (a `pread` of the change word), "
        f"{look['changed_us']:.0f} after another process wrote a backoff (the word, then the "
        f"backoff and switch tables); writing that backoff {look['write_us']:.0f}.",
        "",
    ]

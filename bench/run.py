"""`make bench` / `make bench-quick`: every measure, every peer, one run; JSON and
docs/benchmarks.md.

Peers: `direct` (the client straight to the fake upstream), `limit` (a bare pass-through proxy on
our stack), `floor` (the limit plus the least any router must do: `bench/floor.py`), `lanes`,
`lanes-w2` (`lanes serve --workers 2`), and `litellm` / `litellm-w2` (the LiteLLM proxy in its own
virtualenv, offline, with `--num_workers 1` / `2`) when installed.
All against one fake upstream on loopback; one load generator; warm-up, then repetitions.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import sys
import tempfile
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import trio

from bench import (
    agent,
    audit_report,
    batch100k,
    batchday,
    cache,
    guard,
    hot,
    onehost,
    peers,
    publish,
    shared,
    whatif,
)
from bench.load import body, percentile, run_load, summary
from lanes.harness.processes import free_port

ROOT = Path(__file__).resolve().parent.parent


MODELS = {
    "fast": 30.0,
    "slow": 30.0,
    "ratelimit": 30.0,
    "hang": 2.0,
    "long": 60.0,
}  # model → LiteLLM's timeout (s)


@asynccontextmanager
async def peer(name: str, upstream: str, workdir: Path):
    """One process per peer, serving every model of the shared upstream."""
    if name == "direct":
        yield peers.Peer("direct", upstream, None)
    elif name == "limit":
        async with peers.limit(upstream, workdir) as p:
            yield p
    elif name == "floor":
        async with peers.floor(upstream, workdir) as p:
            yield p
    elif name.startswith("lanes"):
        async with peers.ours(upstream, workdir, models=tuple(MODELS), workers=_workers(name)) as p:
            yield p
    else:
        async with peers.litellm(upstream, workdir, models=MODELS, workers=_workers(name)) as p:
            yield p


def _workers(name: str) -> int:
    """`lanes-w2` → 2 (`lanes serve --workers 2`; LiteLLM's `--num_workers 2`), else 1."""
    return int(name.rpartition("-w")[2]) if "-w" in name else 1


def names() -> list[str]:
    litellm = ["litellm", "litellm-w2"] if peers.litellm_available() else []
    return ["direct", "limit", "floor", "lanes", "lanes-w2", *litellm]


async def speed(p: peers.Peer, quick: bool) -> dict[str, Any]:
    """Latency at concurrency 1 and 8, throughput at 64 (repeated), memory idle and under load."""
    reps, small, seconds = (1, 60, 3.0) if quick else (3, 300, 8.0)
    url = p.url + "/chat/completions"
    await run_load(url, concurrency=8, total=50, headers=p.headers, body=body("fast"))  # warm-up
    row: dict[str, Any] = {"idle_rss_mb": p.rss_mb()}
    rss: list[float] = []
    for stream in (False, True):
        kind = "sse" if stream else "json"
        for conc in (1, 8):
            samples, wall = await run_load(
                url,
                concurrency=conc,
                total=small,
                stream=stream,
                headers=p.headers,
                body=body("fast"),
            )
            row[f"{kind}_c{conc}"] = summary(samples, wall)
        runs = []
        for _ in range(reps):
            async with trio.open_nursery() as nursery:

                async def sample_rss() -> None:
                    await trio.sleep(min(1.0, seconds / 2))
                    if (value := p.rss_mb()) is not None:
                        rss.append(value)

                nursery.start_soon(sample_rss)
                samples, wall = await run_load(
                    url,
                    concurrency=64,
                    duration_s=seconds,
                    stream=stream,
                    headers=p.headers,
                    body=body("fast"),
                )
            runs.append(summary(samples, wall))
        rps = [r["rps"] for r in runs]
        row[f"{kind}_c64"] = {
            **runs[len(runs) // 2],
            "rps": statistics.median(rps),
            "rps_min": min(rps),
            "rps_max": max(rps),
        }
    row["load_rss_mb"] = max(rss, default=None)
    return row


async def long_stream(p: peers.Peer, quick: bool) -> dict[str, Any]:
    """SSE chunks per second through one long stream (the `long` model), median of a few runs."""
    print(f"bench: one long stream through {p.name} …", file=sys.stderr, flush=True)
    rates, chunks = [], 0
    async with httpx2.AsyncClient(trust_env=False, timeout=120) as http:
        for _ in range(1 if quick else 3):
            chunks, start = 0, time.perf_counter()
            try:
                async with http.stream(
                    "POST",
                    p.url + "/chat/completions",
                    json={**body("long"), "stream": True},
                    headers=p.headers,
                ) as response:
                    async for line in response.aiter_lines():
                        chunks += line.startswith("data: {")
            except httpx2.HTTPError as exc:  # a peer that dies of it is a result, not a crash
                return {"chunks": chunks, "chunks_per_s": None, "error": type(exc).__name__}
            rates.append(chunks / (time.perf_counter() - start))
    return {"chunks": chunks, "chunks_per_s": statistics.median(rates), "runs": rates}


async def upstream_log(upstream: str) -> list[tuple[str, float]]:
    async with httpx2.AsyncClient(trust_env=False) as http:
        return [tuple(x) for x in (await http.get(upstream + "/_log")).json()]


async def herd(p: peers.Peer, upstream: str) -> dict[str, Any]:
    """200 concurrent clients, the upstream answering 429 + Retry-After: 5: requests it gets in the
    window."""
    before = len(await upstream_log(upstream))
    samples, _ = await run_load(
        p.url + "/chat/completions",
        concurrency=200,
        total=200,
        headers=p.headers,
        body=body("ratelimit"),
    )
    times = [
        t for model, t in (await upstream_log(upstream))[before:] if model.endswith("ratelimit")
    ]
    first = min(times, default=0.0)
    return {
        "upstream_requests_in_window": sum(1 for t in times if t < first + 5.0),
        "upstream_requests": len(times),
        "client_statuses": sorted({s.status for s in samples}),
    }


async def deadline(p: peers.Peer, quick: bool) -> dict[str, Any]:
    """A hung upstream, a 2 s deadline: one job alone, then many at once; (answer time − 2 s)."""
    count = 50 if quick else 200
    url, headers = p.url + "/chat/completions", {**p.headers, "X-Lanes-Deadline-Ms": "2000"}
    alone, _ = await run_load(
        url, concurrency=1, total=3, headers=headers, body=body("hang"), warm_url=p.url + "/models"
    )
    samples, _ = await run_load(
        url,
        concurrency=count,
        total=count,
        headers=headers,
        body=body("hang"),
        timeout_s=60,
        warm_url=p.url + "/models",
    )
    over = [(s.latency_s - 2.0) * 1000 for s in samples]
    return {
        "jobs": count,
        "statuses": sorted({s.status for s in samples}),
        "alone_overshoot_p50_ms": percentile([(s.latency_s - 2.0) * 1000 for s in alone], 50),
        "overshoot_p50_ms": percentile(over, 50),
        "overshoot_p99_ms": percentile(over, 99),
        "overshoot_max_ms": max(over),
    }


async def startup_ours(workdir: Path) -> float:
    """Process start to the first answer from /ready with every provider dead."""
    async with peers.ours(f"http://127.0.0.1:{free_port()}/v1", workdir) as p:
        assert p.started_s is not None  # peers.ours() times the startup before it yields
        return p.started_s


def machine() -> dict[str, Any]:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    import os

    return {
        "python": sys.version.split()[0],
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(int(Path("/proc/meminfo").read_text().split()[1]) / 1024 / 1024, 1),
        "platform": platform.platform(),
    }


async def main(quick: bool) -> dict[str, Any]:
    from bench.freeshare import free_share

    with tempfile.TemporaryDirectory(prefix="lanes-bench-") as tmp:
        workdir = Path(tmp)
        result: dict[str, Any] = {
            "date": dt.date.today().isoformat(),
            "commit": peers.commit(),  # read when the run starts: what it measured
            "quick": quick,
            "machine": machine(),
            "versions": {
                "lanes": peers.version("lanes"),
                "hypercorn": peers.version("hypercorn"),
                "httpx2": peers.version("httpx2"),
                "trio": peers.version("trio"),
                **({"litellm": peers.version("litellm")} if peers.litellm_available() else {}),
            },
            "speed": {},
            "streams_held": {},
            "long_stream": {},
            "herd": {},
            "deadline": {},
            "startup": {"lanes": await startup_ours(workdir)},
        }
        async with peers.fake_upstream("all", workdir) as (upstream, _):
            for name in names():
                print(f"bench: {name} …", file=sys.stderr, flush=True)
                async with peer(name, upstream, workdir) as p:
                    if p.started_s is not None and name == "litellm":
                        result["startup"]["litellm"] = p.started_s
                    result["speed"][name] = await speed(p, quick)
                    if _workers(name) > 1:  # several workers: throughput only
                        continue
                    if name == "direct":
                        continue
                    result["streams_held"][name] = await hot.streams_held(p, quick)
                    if name in ("lanes", "litellm"):
                        result["herd"][name] = await herd(p, upstream)
                        result["deadline"][name] = await deadline(
                            p, quick
                        )  # last: it leaves jobs hanging
            for name in names():  # on a fresh process each: a peer may not survive it
                if _workers(name) == 1:
                    async with peer(name, upstream, workdir) as p:
                        result["long_stream"][name] = await long_stream(p, quick)
        async with peers.fake_upstream("all", workdir) as (upstream, _):
            result["shared"] = await shared.measure(upstream, workdir, quick)
        async with peers.fake_upstream("all", workdir) as (upstream, _):
            result["one_host"] = await onehost.measure(upstream, workdir)
        added(result["speed"])
        print("bench: free share …", file=sys.stderr, flush=True)
        result["free_share"] = await free_share(hours=2.0 if quick else 24.0)
        print("bench: agent-sized requests …", file=sys.stderr, flush=True)
        result["agent"] = await agent.run(
            rounds=1 if quick else 3, requests=10 if quick else 40, sizes=list(agent.SIZES)
        )
        print("bench: the tiny-request guard (bench.hot --floor) …", file=sys.stderr, flush=True)
        result["hot"] = await hot.compare(
            rounds=1 if quick else 2, seconds=3.0 if quick else 6.0, slices=6, with_floor=True
        )
        published = guard.published_hot(before=result["date"])
        result["guard"] = {"now": guard.guard(result["hot"]), "published": guard.guard(published)}
        print(guard.guard_line(result["hot"], published), flush=True)
        print("bench: a batch over a simulated day …", file=sys.stderr, flush=True)
        result["batchday"] = await batchday.run(quick)
        print("bench: items through the sidecar's batch queue …", file=sys.stderr, flush=True)
        result["batch100k"] = await batch100k.run(quick)
        print("bench: lanes report over a large audit …", file=sys.stderr, flush=True)
        result["audit_report"] = await trio.to_thread.run_sync(
            audit_report.measure, 100_000 if quick else 1_000_000
        )
        print("bench: lanes whatif over a busy day …", file=sys.stderr, flush=True)
        result["whatif"] = await trio.to_thread.run_sync(
            whatif.measure, 10_000 if quick else 100_000
        )
        print("bench: the response cache …", file=sys.stderr, flush=True)
        result["cache"] = await cache.run(
            300 if quick else 1000, 0.3, 2 if quick else 5, 50 if quick else 200
        )
    return result


def added(speed: dict[str, Any]) -> None:
    direct = speed["direct"]
    for row in speed.values():
        for key in ("json_c1", "json_c8", "sse_c1", "sse_c8"):
            field = "ttfb_p50_ms" if key.startswith("sse") else "p50_ms"
            field99 = "ttfb_p99_ms" if key.startswith("sse") else "p99_ms"
            row[f"added_{key}_p50_ms"] = row[key][field] - direct[key][field]
            row[f"added_{key}_p99_ms"] = row[key][field99] - direct[key][field99]


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    data = trio.run(main, args.quick)
    results = ROOT / "bench" / "results"
    stem = f"{data['date']}{'-quick' if args.quick else ''}"
    out = publish.result_path(results, stem, data["commit"])
    for key in ("agent", "hot"):  # where the page says their figures are
        if key in data:
            data[key]["source"] = str(out.relative_to(ROOT))
    # the guard's run, alone too: the next day's guard line compares with it
    if not args.quick and "hot" in data:
        hot_out = publish.result_path(results, f"hot-{data['date']}", data["commit"])
        data["hot"]["source"] = str(hot_out.relative_to(ROOT))
        hot_out.write_text(json.dumps(data["hot"], indent=2))
    out.write_text(json.dumps(data, indent=2))
    from bench.report import write_report

    write_report(data, out)
    print(f"bench: wrote {out.relative_to(ROOT)} and docs/benchmarks.md", file=sys.stderr)

"""`make bench` / `make bench-quick`: every measure, every peer, one run; JSON and docs/benchmarks.md.

Peers: `direct` (the client straight to the fake upstream), `limit` (a bare pass-through proxy on
our stack), `lanes`, and `litellm` (the LiteLLM proxy in its own virtualenv, offline) when installed.
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
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from bench import peers
from bench.load import percentile, run_load, summary
from drills.process import free_port

ROOT = Path(__file__).resolve().parent.parent


@asynccontextmanager
async def peer(name: str, upstream: str, workdir: Path, **kw: Any):
    if name == "direct":
        yield peers.Peer("direct", upstream, None)
    elif name == "limit":
        async with peers.limit(upstream, workdir) as p:
            yield p
    elif name == "lanes":
        async with peers.ours(upstream, workdir, **kw) as p:
            yield p
    else:
        async with peers.litellm(upstream, workdir, **kw) as p:
            yield p


def names() -> list[str]:
    return ["direct", "limit", "lanes"] + (["litellm"] if peers.litellm_available() else [])


async def speed(workdir: Path, quick: bool) -> dict[str, Any]:
    """Added latency at concurrency 1 and 8, throughput at 64, memory idle and under load."""
    reps = 1 if quick else 3
    small, seconds = (60, 3.0) if quick else (300, 8.0)
    out: dict[str, Any] = {}
    async with peers.fake_upstream("fast", workdir) as (upstream, _):
        for name in names():
            async with peer(name, upstream, workdir) as p:
                url = p.url + "/chat/completions"
                await run_load(url, concurrency=8, total=50, headers=p.headers)  # warm-up
                row: dict[str, Any] = {"idle_rss_mb": p.rss_mb()}
                for stream in (False, True):
                    kind = "sse" if stream else "json"
                    for conc in (1, 8):
                        samples, wall = await run_load(url, concurrency=conc, total=small, stream=stream,
                                                       headers=p.headers)
                        row[f"{kind}_c{conc}"] = summary(samples, wall)
                    runs, rss = [], []
                    for _ in range(reps):
                        async with trio.open_nursery() as nursery:
                            async def sample_rss() -> None:
                                await trio.sleep(0.5)
                                rss.append(p.rss_mb())
                            nursery.start_soon(sample_rss)
                            samples, wall = await run_load(url, concurrency=64, duration_s=seconds, stream=stream,
                                                           headers=p.headers)
                        runs.append(summary(samples, wall))
                    rps = [r["rps"] for r in runs]
                    row[f"{kind}_c64"] = {**runs[len(runs) // 2], "rps": statistics.median(rps),
                                          "rps_min": min(rps), "rps_max": max(rps)}
                    row["load_rss_mb"] = max([r for r in rss if r is not None], default=None)
                out[name] = row
    direct = out["direct"]
    for name, row in out.items():
        for key in ("json_c1", "json_c8", "sse_c1", "sse_c8"):
            field = "ttfb_p50_ms" if key.startswith("sse") else "p50_ms"
            field99 = "ttfb_p99_ms" if key.startswith("sse") else "p99_ms"
            row[f"added_{key}_p50_ms"] = row[key][field] - direct[key][field]
            row[f"added_{key}_p99_ms"] = row[key][field99] - direct[key][field99]
    return out


async def streams_held(workdir: Path, quick: bool) -> dict[str, Any]:
    """RSS with many concurrent SSE streams held open (a slow upstream keeps them streaming)."""
    count = 200 if quick else 1000
    out = {}
    async with peers.fake_upstream("slow", workdir) as (upstream, _):
        for name in [n for n in names() if n != "direct"]:
            async with peer(name, upstream, workdir) as p:
                rss = []
                async with trio.open_nursery() as nursery:
                    async def sample() -> None:
                        await trio.sleep(3.0)
                        rss.append(p.rss_mb())
                    nursery.start_soon(sample)
                    samples, _ = await run_load(p.url + "/chat/completions", concurrency=count, total=count,
                                                stream=True, headers=p.headers)
                out[name] = {"streams": count, "ok": sum(s.status == 200 for s in samples), "rss_mb": rss[0]}
    return out


async def startup(workdir: Path) -> dict[str, Any]:
    """Process start to the first answer from /ready (ours) or liveliness (LiteLLM), providers dead."""
    dead = f"http://127.0.0.1:{free_port()}/v1"
    out = {}
    async with peer("lanes", dead, workdir) as p:
        out["lanes"] = p.started_s
    if peers.litellm_available():
        async with peer("litellm", dead, workdir) as p:
            out["litellm"] = p.started_s
    return out


async def herd(workdir: Path) -> dict[str, Any]:
    """200 concurrent clients, the upstream answering 429 + Retry-After: 5: requests it gets in the window."""
    out = {}
    for name in [n for n in names() if n in ("lanes", "litellm")]:
        async with peers.fake_upstream("ratelimit", workdir) as (upstream, log):
            async with peer(name, upstream, workdir) as p:
                samples, _ = await run_load(p.url + "/chat/completions", concurrency=200, total=200, headers=p.headers)
        times = json.loads(log.read_text()) if log.exists() else []
        first = min(times) if times else 0.0
        out[name] = {"upstream_requests_in_window": sum(1 for t in times if t < first + 5.0),
                     "upstream_requests": len(times), "client_statuses": sorted({s.status for s in samples})}
    return out


async def deadline(workdir: Path, quick: bool) -> dict[str, Any]:
    """A hung upstream, 200 concurrent jobs with a 2 s deadline: (answer time − 2 s)."""
    count = 50 if quick else 200
    out = {}
    async with peers.fake_upstream("hang", workdir) as (upstream, _):
        for name in [n for n in names() if n in ("lanes", "litellm")]:
            async with peer(name, upstream, workdir, timeout_s=2.0) as p:
                headers = {**p.headers, "X-Lanes-Deadline-Ms": "2000"}
                samples, _ = await run_load(p.url + "/chat/completions", concurrency=count, total=count,
                                            headers=headers, timeout_s=60, warm_url=p.url + "/models")
                alone, _ = await run_load(p.url + "/chat/completions", concurrency=1, total=5, headers=headers,
                                          timeout_s=60, warm_url=p.url + "/models")
            over = [(s.latency_s - 2.0) * 1000 for s in samples]
            out[name] = {"jobs": count, "statuses": sorted({s.status for s in samples}),
                         "alone_overshoot_p50_ms": percentile([(s.latency_s - 2.0) * 1000 for s in alone], 50),
                         "overshoot_p50_ms": percentile(over, 50), "overshoot_p99_ms": percentile(over, 99),
                         "overshoot_max_ms": max(over)}
    return out


def machine() -> dict[str, Any]:
    cpu = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                if l.startswith("model name")), platform.processor())
    import os
    return {"python": sys.version.split()[0], "cpu": cpu, "cores": os.cpu_count(),
            "memory_gib": round(int(Path("/proc/meminfo").read_text().split()[1]) / 1024 / 1024, 1),
            "platform": platform.platform()}


async def main(quick: bool) -> dict[str, Any]:
    from bench.freeshare import free_share

    with tempfile.TemporaryDirectory(prefix="lanes-bench-") as tmp:
        workdir = Path(tmp)
        result = {"date": dt.date.today().isoformat(), "quick": quick, "machine": machine(),
                  "versions": {"lanes": peers.version("lanes"), "hypercorn": peers.version("hypercorn"),
                               "httpx2": peers.version("httpx2"), "trio": peers.version("trio"),
                               **({"litellm": peers.version("litellm")} if peers.litellm_available() else {})}}
        for label, coro in (("speed", speed(workdir, quick)), ("streams_held", streams_held(workdir, quick)),
                            ("startup", startup(workdir)), ("herd", herd(workdir)),
                            ("deadline", deadline(workdir, quick))):
            print(f"bench: {label} …", file=sys.stderr, flush=True)
            result[label] = await coro
        print("bench: free share …", file=sys.stderr, flush=True)
        result["free_share"] = await free_share(hours=2.0 if quick else 24.0)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    data = trio.run(main, args.quick)
    out = ROOT / "bench" / "results" / f"{data['date']}{'-quick' if args.quick else ''}.json"
    out.write_text(json.dumps(data, indent=2))
    from bench.report import write_report
    write_report(data, out)
    print(f"bench: wrote {out.relative_to(ROOT)} and docs/benchmarks.md", file=sys.stderr)

"""Several sidecars on one Redis: the cross-host herd, the latency the Redis store adds per job, how
fast a kill switch reaches the other host, and the store calls themselves.

Everything runs on this machine: one redis-server on loopback (Debian's package), `lanes serve`
processes, the shared fake upstream. Skipped, with the reason in the results, when redis-server is
not installed (`make redis`).
"""

from __future__ import annotations

import statistics
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx2
import trio

from bench import peers
from bench.load import body, percentile, run_load
from lanes._core.state.paid import PaidAsk
from lanes.harness.redis_server import RedisServer, redis_server_path

PRICES = {"input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0}


async def herd(
    upstream: str, workdir: Path, redis_url: str | None, sidecars: int = 2
) -> dict[str, Any]:
    """200 clients split across `sidecars` processes against 429 + Retry-After: 5 — sharing one
    Redis, or (redis_url None) each with its own state, as separate hosts would without it."""
    async with AsyncExitStack() as stack:
        procs = [
            await stack.enter_async_context(
                peers.ours(upstream, workdir, models=("ratelimit",), state=redis_url or ":memory:")
            )
            for _ in range(sidecars)
        ]
        async with httpx2.AsyncClient(trust_env=False) as http:
            before = len((await http.get(upstream + "/_log")).json())
        statuses: list[int] = []

        async def share(p: peers.Peer, n: int) -> None:
            samples, _ = await run_load(
                p.url + "/chat/completions", concurrency=n, total=n, body=body("ratelimit")
            )
            statuses.extend(s.status for s in samples)

        async with trio.open_nursery() as nursery:
            for p in procs:
                nursery.start_soon(share, p, 200 // sidecars)
        async with httpx2.AsyncClient(trust_env=False) as http:
            times = [
                t
                for model, t in (await http.get(upstream + "/_log")).json()[before:]
                if model == "ratelimit"
            ]
    first = min(times, default=0.0)
    return {
        "sidecars": sidecars,
        "clients": 200,
        "upstream_requests_in_window": sum(1 for t in times if t < first + 5.0),
        "upstream_requests": len(times),
        "client_statuses": sorted(set(statuses)),
    }


async def latency(upstream: str, workdir: Path, redis_url: str, quick: bool) -> dict[str, Any]:
    """p50/p99 per job through one sidecar with its state in SQLite, then in Redis — a free lane
    (no Redis round trip on the hot path) and a paid lane (a reservation per job, in a worker
    thread). Interleaved repetitions; the added latency is Redis minus SQLite within each
    repetition."""
    reps, total = (2, 150) if quick else (5, 400)
    sqlite_path = str(workdir / "bench-state.db")
    runs: dict[str, dict[str, list[dict[str, float]]]] = {}
    for lane_kind, policy, extra in (
        ("rate_limited", None, None),
        ("none", {"free_tier_fallback": "allow", "paid_ceiling_usd_per_day": 1e6}, PRICES),
    ):
        path = "free" if lane_kind == "rate_limited" else "paid"
        for _ in range(reps):
            for store, state in (("sqlite", sqlite_path), ("redis", redis_url)):
                async with peers.ours(
                    upstream,
                    workdir,
                    kind=lane_kind,
                    models=("fast",),
                    state=state,
                    policy=policy,
                    model_extra=extra,
                ) as p:
                    url = p.url + "/chat/completions"
                    await run_load(
                        url, concurrency=8, total=50, body=body("fast")
                    )  # warm-up (and the first probe)
                    for conc in (1, 8):
                        samples, _ = await run_load(
                            url, concurrency=conc, total=total, body=body("fast")
                        )
                        ok = [s.latency_s * 1000 for s in samples if s.status == 200]
                        runs.setdefault(f"{path}_c{conc}", {}).setdefault(store, []).append(
                            {
                                "p50_ms": percentile(ok, 50),
                                "p99_ms": percentile(ok, 99),
                                "ok": len(ok),
                                "jobs": len(samples),
                            }
                        )
    out: dict[str, Any] = {"reps": reps, "jobs_per_rep": total}
    for key, by_store in runs.items():
        row: dict[str, Any] = {}
        for store, values in by_store.items():
            row[store] = {
                "p50_ms": statistics.median(v["p50_ms"] for v in values),
                "p99_ms": statistics.median(v["p99_ms"] for v in values),
                "ok": sum(v["ok"] for v in values),
                "jobs": sum(v["jobs"] for v in values),
            }
        row["added_p50_ms"] = statistics.median(
            r["p50_ms"] - s["p50_ms"]
            for r, s in zip(by_store["redis"], by_store["sqlite"], strict=True)
        )
        row["added_p99_ms"] = statistics.median(
            r["p99_ms"] - s["p99_ms"]
            for r, s in zip(by_store["redis"], by_store["sqlite"], strict=True)
        )
        out[key] = row
    return out


async def in_process(redis_url: str, workdir: Path, quick: bool) -> dict[str, Any]:
    """The same comparison without HTTP in the way: one dispatcher in this process, jobs one at a
    time against an in-process fake (free lane, then paid lane), SQLite file against Redis,
    interleaved."""
    import lanes
    from lanes.harness.configs import KEYS, free_lane, paid_lane
    from lanes.testing import open_fake

    reps, total = (2, 200) if quick else (5, 400)
    added: dict[str, list[float]] = {"free": [], "paid": []}
    p50: dict[str, dict[str, list[float]]] = {
        "free": {"sqlite": [], "redis": []},
        "paid": {"sqlite": [], "redis": []},
    }
    async with open_fake("bench", models=("m",)) as fake:
        for _ in range(reps):
            for path in ("free", "paid"):
                lane = (free_lane if path == "free" else paid_lane)("up", fake.base_url, ["m"])
                medians = {}
                for store, state in (
                    ("sqlite", str(workdir / "in-process.db")),
                    ("redis", redis_url),
                ):
                    config = lanes.load_config(
                        {
                            "state": state,
                            "scoring": {"explore_rate": 0.0},
                            "lanes": [lane],
                            "policy": {
                                "free_tier_fallback": "allow",
                                "paid_ceiling_usd_per_day": 1e6,
                            },
                        },
                        env={},
                    )
                    async with lanes.open_dispatcher(config, env=KEYS) as d:
                        samples = []
                        for i in range(total + 20):
                            start = time.perf_counter()  # wall-clock: a latency measure
                            await d.complete(
                                lanes.Job(
                                    messages=[{"role": "user", "content": "Benchmark."}],
                                    model="up/m",
                                )
                            )
                            if i >= 20:  # the first ones warm up (and probe)
                                samples.append(
                                    (time.perf_counter() - start) * 1000
                                )  # wall-clock: as above
                    medians[store] = statistics.median(samples)
                    p50[path][store].append(medians[store])
                added[path].append(medians["redis"] - medians["sqlite"])
    return {
        "reps": reps,
        "jobs_per_rep": total,
        **{
            path: {
                "sqlite_p50_ms": statistics.median(p50[path]["sqlite"]),
                "redis_p50_ms": statistics.median(p50[path]["redis"]),
                "added_p50_ms": statistics.median(added[path]),
            }
            for path in added
        },
    }


async def kill_switch(
    upstream: str, workdir: Path, redis_url: str, tries: int = 5
) -> dict[str, Any]:
    """`POST /v1/lanes/up/off` on one sidecar → the other's `/v1/lanes` says off: milliseconds,
    polled every 2 ms."""
    async with (
        peers.ours(upstream, workdir, models=("fast",), state=redis_url) as a,
        peers.ours(upstream, workdir, models=("fast",), state=redis_url) as b,
        httpx2.AsyncClient(trust_env=False) as http,
    ):
        base_a, base_b = a.url.removesuffix("/v1"), b.url.removesuffix("/v1")
        samples = []
        for i in range(tries * 2):
            off = i % 2 == 0
            start = time.monotonic()  # wall-clock: propagation between two real processes
            await http.post(f"{base_a}/v1/lanes/up/{'off' if off else 'on'}", json={})
            while True:
                state = (await http.get(f"{base_b}/v1/lanes")).json()
                if state["lanes"][0]["off"] == off:
                    break
                await trio.sleep(0.002)
            samples.append((time.monotonic() - start) * 1000)  # wall-clock: as above
    return {"samples": len(samples), "p50_ms": statistics.median(samples), "max_ms": max(samples)}


def store_calls(redis_url: str, workdir: Path, n: int = 2000) -> dict[str, Any]:
    """The two calls that can wait on the store during a job — a paid reservation and a probe
    lease — timed directly (µs per call, one thread), SQLite file against Redis on loopback."""
    from lanes._core.state.redis_store import RedisStore
    from lanes._core.state.store import SQLiteStore

    sqlite = SQLiteStore(str(workdir / "calls.db"))
    shared = RedisStore(redis_url, local=SQLiteStore(":memory:"))
    shared.begin_sync(time.time())
    shared.flush()
    out: dict[str, Any] = {}
    for name, store in (("sqlite", sqlite), ("redis", shared)):
        start = time.perf_counter()  # wall-clock: a micro-benchmark
        for i in range(n):
            store.reserve(
                PaidAsk(
                    day=1, amount=1e-9, ceiling=1.0, lane="p", model="m", job=f"j{i}", cohort=None
                )
            )
        reserve = (time.perf_counter() - start) / n * 1e6  # wall-clock: as above
        start = time.perf_counter()  # wall-clock: as above
        for i in range(n):
            store.probe_lease(f"scope-{i}", 5.0)
        lease = (time.perf_counter() - start) / n * 1e6  # wall-clock: as above
        out[name] = {"reserve_paid_us": reserve, "probe_lease_us": lease}
    sqlite.close()
    shared.close()
    return out


async def measure(upstream: str, workdir: Path, quick: bool) -> dict[str, Any]:
    if redis_server_path() is None:
        return {"skipped": "redis-server is not installed (make redis)"}
    server = RedisServer(workdir / "redis").start()
    try:
        print("bench: several sidecars (herd) …", file=sys.stderr, flush=True)
        result: dict[str, Any] = {
            "herd": {
                f"{kind}_{n}": await herd(upstream, workdir, url, sidecars=n)
                for n in (2, 4)
                for kind, url in (("shared", server.url), ("separate", None))
            }
        }
        print("bench: several sidecars (latency) …", file=sys.stderr, flush=True)
        result["latency"] = await latency(upstream, workdir, server.url, quick)
        result["in_process"] = await in_process(server.url, workdir, quick)
        result["kill_switch"] = await kill_switch(upstream, workdir, server.url)
        result["store_calls"] = await trio.to_thread.run_sync(store_calls, server.url, workdir)
        hops = []
        for _ in range(200):  # the trio → worker thread → trio hop every Redis call pays on top
            start = time.perf_counter()  # wall-clock: a micro-benchmark
            await trio.to_thread.run_sync(int)
            hops.append((time.perf_counter() - start) * 1e6)  # wall-clock: as above
        result["store_calls"]["thread_hop_us"] = statistics.median(hops)
        return result
    finally:
        server.stop()

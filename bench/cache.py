"""The response cache: the free quota a day with repeats uses with and without it, and what a hit
and a miss cost lanes against no cache at all.

`python -m bench.cache [--requests 1000] [--repeat 0.3] [--rounds 5] [--latency 100]`:

- **A day with repeats**: `--requests` deterministic (`temperature` 0) requests, of which a share
  `--repeat` asks again something asked earlier that day (drawn with a fixed seed), sent one at a
  time through `lanes serve` with `[cache] mode = "on"` and with no cache; the quota used is what
  the fake upstream received.
- **What lanes spends**: one at a time, per round and in turn, `--latency` requests through the
  sidecar without a cache, misses (each request new) and hits (the same request again) through the
  one with it: the wall time per request (client included; medians over rounds) and the sidecar's
  CPU per request from its CPU clock — lanes' own time, without the client's.

Writes `bench/results/cache-<date>.json`. Nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2
import trio

from bench import peers, publish

ROOT = Path(__file__).resolve().parent.parent


def day(requests: int, repeat: float, seed: int = 7) -> list[int]:
    """Which question each request of the day asks: a new one, or (a `repeat` share) one asked
    before, drawn uniformly."""
    rng = random.Random(seed)
    asked: list[int] = []
    for n in range(requests):
        asked.append(rng.choice(asked) if asked and rng.random() < repeat else n)
    return asked


def body(question: int) -> dict[str, Any]:
    text = f"Question {question}: what does a free-first router do with a repeated prompt?"
    return {"model": "m", "temperature": 0, "messages": [{"role": "user", "content": text}]}


async def upstream_count(http: httpx2.AsyncClient, upstream: str) -> int:
    return len((await http.get(f"{upstream}/_log")).json())


async def send(http: httpx2.AsyncClient, peer: peers.Peer, asked: dict[str, Any]) -> str:
    answer = await http.post(f"{peer.url}/chat/completions", json=asked)
    if answer.status_code != 200:
        raise RuntimeError(f"{peer.name}: answered {answer.status_code}: {answer.text[:200]}")
    return answer.headers.get("x-lanes-cache", "")


async def timed(
    http: httpx2.AsyncClient, peer: peers.Peer, bodies: list[dict[str, Any]], expect: str
) -> tuple[float, float]:
    """(median wall ms per request, sidecar CPU ms per request) over `bodies`, one at a time."""
    walls, before = [], peer.own_cpu_s()
    for asked in bodies:
        start = time.perf_counter()  # wall-clock: a benchmark's own timing
        said = await send(http, peer, asked)
        walls.append(1000 * (time.perf_counter() - start))  # wall-clock: as above
        if said != expect:
            raise RuntimeError(f"{peer.name}: X-Lanes-Cache {said!r}, expected {expect!r}")
    return statistics.median(walls), 1000 * (peer.own_cpu_s() - before) / len(bodies)


async def run(requests: int, repeat: float, rounds: int, latency: int) -> dict[str, Any]:
    asked = day(requests, repeat)
    with tempfile.TemporaryDirectory(prefix="lanes-cache-") as tmp:
        workdir = Path(tmp)
        async with (
            peers.fake_upstream("fast", workdir) as (upstream, _),
            peers.ours(upstream, workdir, kind="local") as plain,
            peers.ours(
                upstream, workdir, kind="local", state=str(workdir / "state.db"), cache=True
            ) as cached,
            httpx2.AsyncClient(trust_env=False, timeout=30) as http,
        ):
            used = {}
            for label, peer in (("plain", plain), ("cached", cached)):
                before = await upstream_count(http, upstream)
                for question in asked:
                    await send(http, peer, body(question))
                used[label] = await upstream_count(http, upstream) - before
                print(f"day: {label} {used[label]} upstream requests", file=sys.stderr)
            figures: dict[str, list[tuple[float, float]]] = {"off": [], "miss": [], "hit": []}
            fresh = iter(range(10**6, 10**7))
            hit = body(0)  # asked in the day already: a hit from the start
            for r in range(rounds):
                runs = [
                    ("off", plain, [body(next(fresh)) for _ in range(latency)], ""),
                    ("miss", cached, [body(next(fresh)) for _ in range(latency)], "miss"),
                    ("hit", cached, [hit] * latency, "hit"),
                ]
                for name, peer, bodies, expect in runs[r % 3 :] + runs[: r % 3]:
                    figures[name].append(await timed(http, peer, bodies, expect))
                print(f"round {r + 1}: " + ", ".join(
                    f"{k} {v[-1][0]:.2f} ms ({v[-1][1]:.2f} cpu)" for k, v in figures.items()
                ), file=sys.stderr)  # fmt: skip
    med = {
        name: {
            "wall_ms": statistics.median(w for w, _ in got),
            "cpu_ms": statistics.median(c for _, c in got),
        }
        for name, got in figures.items()
    }
    return {
        "date": dt.date.today().isoformat(),
        "cpu_clock": "process",  # `peers.process_cpu_s`: how the report says CPU was read
        "requests": requests,
        "repeat": repeat,
        "distinct": len(set(asked)),
        "upstream": {"no_cache": used["plain"], "cache": used["cached"]},
        "saved_share": 1 - used["cached"] / used["plain"],
        "c1": med,
        "library_us": await in_library(2000),
        "miss_over_off_cpu": med["miss"]["cpu_ms"] / med["off"]["cpu_ms"],
        "miss_over_off_wall": med["miss"]["wall_ms"] / med["off"]["wall_ms"],
        "hit_over_off_cpu": med["hit"]["cpu_ms"] / med["off"]["cpu_ms"],
        "raw": figures,
    }


async def in_library(n: int) -> dict[str, float]:
    """CPU µs per job in `dispatcher.complete` itself (the library, no HTTP server), one at a
    time, against a fake in the same process: no cache, a miss, a hit. The fake's own CPU is in
    the first two, not in a hit (nothing is sent)."""
    import lanes
    from lanes.harness.configs import local_lane
    from lanes.testing import open_fake

    out = {}
    with tempfile.TemporaryDirectory(prefix="lanes-cache-lib-") as tmp:
        async with open_fake("local", models=("local-model",)) as fake:
            for name, cache in (("off", None), ("miss", "on"), ("hit", "on")):
                table = {
                    "state": f"{tmp}/{name}.db",
                    "lanes": [local_lane("local", fake.base_url)],
                    "log_jobs": False,
                    **({"cache": {"mode": cache}} if cache else {}),
                }
                config = lanes.load_config(table, env={})
                async with lanes.open_dispatcher(config, env={}) as dispatcher:
                    asked = [body(0 if name == "hit" else q)["messages"] for q in range(n + 1)]
                    jobs = [lanes.Job(messages=m, params={"temperature": 0}) for m in asked]
                    await dispatcher.complete(jobs[0])  # warm, and the hit's entry
                    start = time.process_time()  # the process's CPU: the writer's too
                    for job in jobs[1:]:
                        await dispatcher.complete(job)
                    if dispatcher.cache is not None:
                        await dispatcher.cache.settled()
                    out[name] = 1e6 * (time.process_time() - start) / n
    return out


def section(result: dict[str, Any] | None) -> list[str]:
    """docs/benchmarks.md's section, from a run's figures (None: none yet)."""
    if not result:
        return []
    c1, up = result["c1"], result["upstream"]
    return [
        "## The response cache",
        "",
        f"`python -m bench.cache` on {result['date']}: a day of {result['requests']:,} "
        f"deterministic requests, {result['repeat']:.0%} of them asking again something asked "
        f"earlier ({result['distinct']:,} distinct), through `lanes serve` with and without "
        '`[cache] mode = "on"`; then, one at a time and in turn, requests without a cache, '
        "misses and hits. Wall time per request includes the client; CPU is the sidecar's own "
        f"({'its CPU clock' if result.get('cpu_clock') == 'process' else 'from /proc'}).",
        "",
        "| | no cache | cache |",
        "|---|---|---|",
        f"| upstream requests (free quota used) | {up['no_cache']:,} | {up['cache']:,} |",
        "",
        "| c=1 | wall ms / request (median) | sidecar CPU ms / request |",
        "|---|---|---|",
        *(
            f"| {name} | {c1[key]['wall_ms']:.2f} | {c1[key]['cpu_ms']:.2f} |"
            for name, key in (("no cache", "off"), ("miss", "miss"), ("hit", "hit"))
        ),
        "",
        f"Ratios: quota saved {result['saved_share']:.1%}; a miss over no cache: CPU "
        f"{result['miss_over_off_cpu']:.2f}×, wall {result['miss_over_off_wall']:.2f}×; a hit "
        f"over no cache: CPU {result['hit_over_off_cpu']:.2f}×.",
        "",
        *(
            [
                "In the library (`dispatcher.complete`, no HTTP server; CPU per job, a fake in "
                "the same process): no cache {off:.0f} µs, a miss {miss:.0f} µs, a hit {hit:.0f} "
                "µs — a hit's own time in lanes, apart from the HTTP server's.".format(
                    **result["library_us"]
                ),
                "",
            ]
            if "library_us" in result
            else []
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--repeat", type=float, default=0.3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--latency", type=int, default=100)
    args = parser.parse_args()
    head = peers.commit()  # when the run starts: what it measures
    result = trio.run(run, args.requests, args.repeat, args.rounds, args.latency)
    out = publish.result_path(ROOT / "bench" / "results", f"cache-{result['date']}", head)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print("\n".join(section(result)))


if __name__ == "__main__":
    main()

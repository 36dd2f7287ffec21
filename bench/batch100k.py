"""`python -m bench.batch100k [--quick | --queue-calls SIZES [--redis URL]]`: items through the
sidecar's durable batch queue.

A real `lanes serve` process with its state and queue in SQLite files (`state = <tmp>/state.db`,
so the queue is `<tmp>/state.db.batches/`) over one fast local lane (a `lanes.testing` fake in
this process, on 127.0.0.1; a local lane has no quota, so no item waits). A 10,000-line JSONL file
is uploaded over HTTP (`POST /v1/files`), its batch created (window 24 h) and run to its end, and
its output file streamed back. Then (not `--quick`) a 100,000-line one the same way, run to its
end — or, should it run past `WINDOW_S`, cancelled there, its output and error files (every item
answered, `batch_cancelled` for those not run) streamed back all the same.

Measured: the wall time of each step; items per second; the sidecar's CPU (user + system, its
CPU clock) per item, beside its CPU per request for the same body sent as ordinary requests at the
same concurrency (what routing a job costs anyway), so the difference is the queue's own cost;
wall time per item less the fake's own time (this process's CPU: the fake, the polls and the
probe); the sidecar's resident memory (idle after a warm-up, sampled every 0.1 s throughout, and
its high-water mark); interactive requests one at a time beside each batch as it starts, against
the same with the sidecar otherwise idle; and the queue's own calls with 1,000, 10,000 and
100,000 items pending (SQLite, no HTTP). Writes bench/results/batch100k-DATE[-quick].json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2
import trio

from bench import publish
from bench.load import percentile, run_load
from bench.peers import commit
from bench.peers import process_cpu_s as cpu_s
from lanes._core.batch.queue import BatchQueue, Caps
from lanes._core.batch.sqlite_queue import SQLiteBatchQueue
from lanes.harness.processes import open_sidecar_process
from lanes.testing import open_fake

ROOT = Path(__file__).resolve().parent.parent
HEADERS = {"Authorization": "Bearer bench-batch-client"}
CONCURRENCY = 4  # `[batch] concurrency`'s default: the runner's items at once


def jsonl(path: Path, items: int) -> int:
    """Write `items` chat lines to `path`; its size in bytes."""
    with path.open("w") as out:
        for i in range(items):
            body = {"model": "m", "messages": [{"role": "user", "content": f"Classify: {i}"}]}
            line = {
                "custom_id": f"item-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": body,
            }
            out.write(json.dumps(line) + "\n")
    return path.stat().st_size


def memory_mb(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (the peak resident set) of `pid`, MiB."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0]) / 1024
    return found


def config(upstream: str, workdir: Path, items: int) -> dict[str, Any]:
    return {
        "state": str(workdir / "state.db"),
        "local_state": str(workdir / "local.db"),
        "lanes": [
            {
                "name": "local",
                "module": "openai_compatible",
                "base_url": upstream,
                "api_key_env": "",
                "free_tier": {"kind": "local"},
                "models": [{"id": "m"}],
            }
        ],
        "batch": {"max_lines": max(items, 50_000), "concurrency": CONCURRENCY},
    }


async def measure(quick: bool) -> dict[str, Any]:
    """The sidecar measured as the module's text says: a 10,000-item batch to its end, and (not
    `quick`) a 100,000-item one, cancelled should it run past `WINDOW_S`."""
    with tempfile.TemporaryDirectory(prefix="lanes-batch100k-") as tmp:
        workdir = Path(tmp)
        sources = {}
        for items in (10_000,) if quick else (10_000, 100_000):
            sources[items] = workdir / f"items-{items}.jsonl"
            await trio.to_thread.run_sync(jsonl, sources[items], items)
        async with (
            open_fake("local", models=("m",)) as fake,
            open_sidecar_process(config(fake.base_url, workdir, 100_000), workdir) as car,
        ):
            found = await _drive(car.base, car.process.pid, sources, fake)
    found["queue_calls"] = await trio.to_thread.run_sync(
        queue_calls, (1_000, 10_000) if quick else (1_000, 10_000, 100_000)
    )
    return found


BODY = {"model": "m", "messages": [{"role": "user", "content": "Classify: 1"}]}
PROBE_S = 15.0  # interactive requests one at a time for this long: before the batch, and during
PROBE_GAP_S = 0.02  # between them (a light load: about 45 a second)
WINDOW_S = 3600.0  # the 100,000-item batch runs at most this long, then it is cancelled
EVERY_S = 0.5  # how often the batch's progress is asked


async def per_request(base: str, pid: int, count: int) -> dict[str, Any]:
    """What a job costs the sidecar anyway: `count` ordinary requests of an item's body at the
    batch's concurrency — its CPU and the wall time per request."""
    cpu0, wall0 = cpu_s(pid), time.perf_counter()  # wall-clock: a benchmark of real time
    samples, _ = await run_load(
        f"{base}/v1/chat/completions",
        concurrency=CONCURRENCY,
        total=count,
        body=BODY,
        headers=HEADERS,
    )
    return {
        "requests": count,
        "ok": sum(s.status == 200 for s in samples),
        "cpu_ms_per_request": (cpu_s(pid) - cpu0) / count * 1000,
        "wall_ms_per_request": (time.perf_counter() - wall0) / count * 1000,  # wall-clock
    }


async def probe(base: str) -> list[float]:
    """Latencies (ms) of interactive requests sent one at a time for `PROBE_S`."""
    latencies: list[float] = []
    async with httpx2.AsyncClient(headers=HEADERS, timeout=60, trust_env=False) as http:
        until = trio.current_time() + PROBE_S
        while trio.current_time() < until:
            began = trio.current_time()
            answer = await http.post(f"{base}/v1/chat/completions", json=BODY)
            if answer.status_code == 200:
                latencies.append((trio.current_time() - began) * 1000)
            await trio.sleep(PROBE_GAP_S)
    return latencies


def latency(samples: list[float]) -> dict[str, Any]:
    return {
        "requests": len(samples),
        "p50_ms": percentile(samples, 50),
        "p99_ms": percentile(samples, 99),
    }


async def _drive(base: str, pid: int, sources: dict[int, Path], fake: Any) -> dict[str, Any]:
    await per_request(base, pid, 200)  # warm: imports, pools, caches
    await trio.sleep(1.0)
    idle = memory_mb(pid)["VmRSS"]
    interactive = await per_request(base, pid, 10_000)
    alone = await probe(base)
    await trio.sleep(1.0)
    found: dict[str, Any] = {
        "concurrency": CONCURRENCY,
        "interactive": interactive,
        "probe_alone": latency(alone),
        "idle_rss_mb": idle,
        "before_rss_mb": memory_mb(pid)["VmRSS"],
    }
    rss: list[float] = []
    async with trio.open_nursery() as nursery:

        async def sample() -> None:
            while True:
                rss.append(memory_mb(pid)["VmRSS"])
                await trio.sleep(0.1)

        nursery.start_soon(sample)
        async with httpx2.AsyncClient(
            base_url=base, headers=HEADERS, timeout=600, trust_env=False
        ) as http:
            for items, source in sources.items():
                budget = None if items <= 10_000 else WINDOW_S
                found[str(items)] = await one_batch(
                    http, pid, source, items, budget, fake, interactive["cpu_ms_per_request"]
                )
                found[str(items)]["peak_rss_mb"] = max(rss, default=0.0)
        nursery.cancel_scope.cancel()
    peak = memory_mb(pid)
    return found | {
        "peak_rss_mb": max(rss, default=found["before_rss_mb"]),
        "rss_hwm_mb": peak["VmHWM"],
        "end_rss_mb": peak["VmRSS"],
        "rss_growth_mb": max(rss, default=found["before_rss_mb"]) - idle,
    }


async def one_batch(
    http: httpx2.AsyncClient,
    pid: int,
    source: Path,
    items: int,
    budget_s: float | None,
    fake: Any,
    request_cpu_ms: float,
) -> dict[str, Any]:
    """Upload `source`, create its batch, let it run to its end (or for `budget_s`, then cancel
    it), stream its output and error files back; the figures. Interactive requests are probed
    during its first `PROBE_S`."""
    steps: dict[str, float] = {}
    t = time.perf_counter()  # wall-clock
    with source.open("rb") as stream:  # read by httpx2 as it sends
        upload = await http.post(
            "/v1/files",
            data={"purpose": "batch"},
            files={"file": (source.name, stream, "application/jsonl")},
        )
    upload.raise_for_status()
    steps["upload_s"] = time.perf_counter() - t  # wall-clock
    t = time.perf_counter()  # wall-clock
    created = await http.post(
        "/v1/batches",
        json={
            "input_file_id": upload.json()["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        },
    )
    created.raise_for_status()
    steps["create_s"] = time.perf_counter() - t  # wall-clock
    batch_id = created.json()["id"]
    served_before, fake_cpu0 = len(fake.log), time.process_time()
    cpu0, t = cpu_s(pid), time.perf_counter()  # wall-clock
    progress: list[tuple[float, int]] = []
    beside: list[float] = []
    async with trio.open_nursery() as nursery:

        async def interactive() -> None:
            beside.extend(await probe(str(http.base_url).rstrip("/")))

        nursery.start_soon(interactive)
        while True:
            batch = (await http.get(f"/v1/batches/{batch_id}")).json()
            counts = batch["request_counts"]
            progress.append((time.perf_counter() - t, counts["completed"] + counts["failed"]))
            if batch["status"] in ENDED or budget_s is not None and progress[-1][0] >= budget_s:
                break
            await trio.sleep(EVERY_S)
    steps["run_s"] = time.perf_counter() - t  # wall-clock
    done = progress[-1][1]
    # the probe's own requests, at what an ordinary request costs, are not the items'
    run_cpu = cpu_s(pid) - cpu0 - len(beside) * request_cpu_ms / 1000
    fake_cpu = time.process_time() - fake_cpu0  # this process: the fake, the polls, the probe
    if batch["status"] not in ENDED:
        await http.post(f"/v1/batches/{batch_id}/cancel")
        while batch["status"] not in ENDED:
            await trio.sleep(EVERY_S)
            batch = (await http.get(f"/v1/batches/{batch_id}")).json()
    t = time.perf_counter()  # wall-clock
    lines = {
        kind: await count_lines(http, batch.get(f"{kind}_file_id")) for kind in ("output", "error")
    }
    steps["download_s"] = time.perf_counter() - t  # wall-clock
    return {
        "items": items,
        "file_mb": (await trio.Path(source).stat()).st_size / 1e6,
        "status": batch["status"],
        "done_in_run": done,
        "completed": batch["request_counts"]["completed"],
        "failed": batch["request_counts"]["failed"],
        "output_lines": lines["output"],
        "error_lines": lines["error"],
        "upstream_requests": len(fake.log) - served_before - len(beside),
        **steps,
        "items_per_s": done / steps["run_s"],
        "wall_ms_per_item": steps["run_s"] / done * 1000,
        "fake_cpu_ms_per_item": fake_cpu / done * 1000,
        "overhead_wall_ms_per_item": (steps["run_s"] - fake_cpu) / done * 1000,
        "sidecar_cpu_ms_per_item": run_cpu / done * 1000,
        "queue_cpu_ms_per_item": run_cpu / done * 1000 - request_cpu_ms,
        "probe_beside_batch": latency(beside),
        "progress": progress,
    }


ENDED = ("completed", "failed", "expired", "cancelled")


async def count_lines(http: httpx2.AsyncClient, file_id: str | None) -> int:
    """The lines of a batch's output or error file, streamed (0 when it has none)."""
    if not file_id:
        return 0
    lines = 0
    async with http.stream("GET", f"/v1/files/{file_id}/content") as body:
        async for line in body.aiter_lines():
            lines += bool(line)
    return lines


def queue_calls(
    sizes: tuple[int, ...], redis_url: str | None = None
) -> dict[str, dict[str, float]]:
    """The queue's own calls (`SQLiteBatchQueue`, or with `redis_url` `RedisBatchQueue` on that
    server — emptied first — no HTTP), µs each, with a batch of each size pending: what one round
    of the runner asks — `take` (and `later`) of 4 items, `next_due`, `settle` — and one item's
    `finish`."""
    found = {}
    for size in sizes:
        with tempfile.TemporaryDirectory(prefix="lanes-queue-") as tmp:
            found[str(size)] = _calls(Path(tmp), size, redis_url)
    return found


def _open(folder: Path, caps: Caps, redis_url: str | None) -> BatchQueue:
    if redis_url is None:
        return SQLiteBatchQueue(folder / "queue", caps)
    import redis

    from lanes._core.batch.redis_queue import RedisBatchQueue

    redis.Redis.from_url(redis_url).flushall()
    return RedisBatchQueue(redis_url, caps, folder / "scratch")


def _calls(folder: Path, size: int, redis_url: str | None = None) -> dict[str, float]:
    jsonl(folder / "upload.jsonl", size)
    caps = Caps(max_bytes=10**9, max_lines=10**7, max_line_bytes=10**6)
    queue = _open(folder, caps, redis_url)
    now = 1_800_000_000
    try:
        upload = queue.add_file("c", "batch", "in.jsonl", folder / "upload.jsonl", now)
        ask = {
            "input_file_id": upload["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        }
        t = time.perf_counter()
        queue.create("c", ask, now)
        created_s = time.perf_counter() - t
        queue.lead("bench", now, 15.0)
        return {
            "create_s": created_s,
            "take_4_us": _each(lambda: _take_back(queue, now)),
            "next_due_us": _each(lambda: queue.next_due(now)),
            "settle_us": _each(lambda: queue.settle(now)),
            "finish_us": _finish_each(queue, queue.take(now, 20)),
        }
    finally:
        queue.close()


def _take_back(queue: BatchQueue, now: float) -> None:
    """Take 4 items, as a round of the runner does, and put them back."""
    for item in queue.take(now, 4):
        queue.later(item, now)


def _finish_each(queue: BatchQueue, items: list[Any]) -> float:
    """µs per `finish` of items already taken."""
    t = time.perf_counter()
    for item in items:
        queue.finish(item, ok=True, line=b"{}")
    return (time.perf_counter() - t) / len(items) * 1e6


def _each(call: Any, times: int = 20) -> float:
    """µs per `call()`, over `times` calls."""
    t = time.perf_counter()
    for _ in range(times):
        call()
    return (time.perf_counter() - t) / times * 1e6


async def run(quick: bool) -> dict[str, Any]:
    """`measure`, dated and saved: bench/results/batch100k-DATE[-quick].json."""
    data = {
        "date": dt.date.today().isoformat(),
        "commit": commit(),
        "cpu_clock": "process",  # `peers.process_cpu_s`: how the report says CPU was read
        **await measure(quick),
    }
    stem = f"batch100k-{data['date']}{'-quick' if quick else ''}"
    path = publish.result_path(ROOT / "bench" / "results", stem, data["commit"])
    await trio.Path(path).write_text(json.dumps(data, indent=2))
    return data


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the 10,000-item batch only")
    parser.add_argument(
        "--queue-calls",
        metavar="SIZES",
        help="only the queue's own calls, with batches of these sizes (10000,100000); not saved",
    )
    parser.add_argument(
        "--redis", metavar="URL", help="with --queue-calls: the Redis queue on URL (emptied)"
    )
    args = parser.parse_args()
    if args.queue_calls:
        sizes = tuple(int(n) for n in args.queue_calls.split(","))
        print(json.dumps(queue_calls(sizes, args.redis), indent=2))
    else:
        print(json.dumps(trio.run(run, args.quick), indent=2))

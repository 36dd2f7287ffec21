"""One load generator for every peer: trio + httpx2, JSON or SSE, fixed concurrency, latencies and
time to first byte per request (seconds, this process's monotonic trio clock)."""

from __future__ import annotations

import contextlib
import statistics
from typing import Any

import attrs
import httpx2
import trio

BODY = {"model": "m", "messages": [{"role": "user", "content": "Benchmark: say the pangram."}]}


@attrs.frozen(kw_only=True)
class Sample:
    latency_s: float
    ttfb_s: float
    status: int


async def one(
    http: httpx2.AsyncClient,
    url: str,
    *,
    stream: bool,
    headers: dict[str, str],
    body: dict[str, Any],
) -> Sample:
    start = trio.current_time()
    first = None
    payload = {**body, "stream": True} if stream else body
    try:
        async with http.stream("POST", url, json=payload, headers=headers) as response:
            async for _ in response.aiter_raw():
                if first is None:
                    first = trio.current_time()
            status = response.status_code
    except httpx2.HTTPError:
        status = 599
    end = trio.current_time()
    return Sample(latency_s=end - start, ttfb_s=(first or end) - start, status=status)


async def run_load(
    url: str,
    *,
    concurrency: int,
    total: int | None = None,
    duration_s: float | None = None,
    stream: bool = False,
    headers: dict[str, str] | None = None,
    body: dict[str, Any] | None = None,
    timeout_s: float = 60.0,
    warm_url: str | None = None,
) -> tuple[list[Sample], float]:
    """`total` requests (or as many as fit in `duration_s`) over `concurrency` connections;
    returns the samples and the wall time. With `warm_url`, every connection is opened (one GET
    there, all at once) before the clock starts, so connection setup is not measured."""
    samples: list[Sample] = []
    limits = httpx2.Limits(
        max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8
    )
    async with httpx2.AsyncClient(limits=limits, timeout=timeout_s, trust_env=False) as http:
        if warm_url:
            async with trio.open_nursery() as nursery:
                for _ in range(concurrency):
                    nursery.start_soon(_get, http, warm_url, headers or {})
        remaining = [total if total is not None else 10**9]
        start = trio.current_time()
        stop_at = start + duration_s if duration_s is not None else float("inf")

        async def worker() -> None:
            while remaining[0] > 0 and trio.current_time() < stop_at:
                remaining[0] -= 1
                samples.append(
                    await one(http, url, stream=stream, headers=headers or {}, body=body or BODY)
                )

        async with trio.open_nursery() as nursery:
            for _ in range(concurrency):
                nursery.start_soon(worker)
        return samples, trio.current_time() - start


async def _get(http: httpx2.AsyncClient, url: str, headers: dict[str, str]) -> None:
    with contextlib.suppress(httpx2.HTTPError):
        await http.get(url, headers=headers)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def summary(samples: list[Sample], wall_s: float) -> dict[str, float]:
    ok = [s for s in samples if s.status == 200]
    lat = [s.latency_s for s in ok]
    ttfb = [s.ttfb_s for s in ok]
    return {
        "requests": len(samples),
        "ok": len(ok),
        "rps": len(ok) / wall_s if wall_s else 0.0,
        "p50_ms": percentile(lat, 50) * 1000,
        "p99_ms": percentile(lat, 99) * 1000,
        "ttfb_p50_ms": percentile(ttfb, 50) * 1000,
        "ttfb_p99_ms": percentile(ttfb, 99) * 1000,
        "mean_ms": statistics.fmean(lat) * 1000 if lat else float("nan"),
    }


def body(model: str = "fast") -> dict[str, Any]:
    """The request every speed measure sends (the fake upstream's `model` says how it answers)."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": "Benchmark: say the pangram."}],
    }

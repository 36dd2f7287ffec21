"""Free share against an oracle: a simulated day of traffic (virtual time) over five free providers
with known quotas and a paid fallback.

Traffic: Poisson arrivals with bursts. Providers report their limits the way real ones do — some in
headers, some only in 429 bodies, one not at all (and one whose limits are not in our config).

The oracle knows every quota and the whole arrival sequence in advance and assigns jobs to free
providers optimally. Its value is the maximum flow of the network source → minute (jobs arriving in
it) → provider (its per-minute quota) → sink (its per-day quota), computed exactly by enumerating
the 2^5 ways to cut the provider→sink edges (max-flow = min-cut). No router, online or not, can
serve more jobs free under those quotas, so it is an upper bound.
"""

from __future__ import annotations

import calendar
import datetime as dt
import itertools
import random
import time
from typing import Any

import trio
import trio.testing

import lanes
from lanes.harness.configs import KEYS, paid_lane
from lanes.testing import open_fake, quota

# name, per minute, per day, how it reports, whether our config knows the limits
PROVIDERS = [
    ("p-headers", 10, 1500, "openai", True),
    ("p-body-only", 5, 250, "gemini", True),
    ("p-epoch-ms", 20, 1000, "openrouter", True),
    ("p-unconfigured", 8, 800, "openai", False),
    ("p-small", 30, 500, "openai", True),
]


def arrivals(hours: float, seed: int = 11) -> list[float]:
    """Poisson arrivals (0.04/s) with six 5-minute bursts a day at 2/s, scaled to `hours`."""
    rng = random.Random(seed)
    horizon = hours * 3600
    times, t = [], 0.0
    while True:
        t += rng.expovariate(0.04)
        if t >= horizon:
            break
        times.append(t)
    for _ in range(max(1, int(6 * hours / 24))):
        start = rng.uniform(0, horizon - 300)
        s = start
        while s < start + 300:
            s += rng.expovariate(2.0)
            times.append(s)
    return sorted(times)


def oracle(times: list[float]) -> int:
    """The most jobs any assignment could serve free (exact max-flow by min-cut enumeration)."""
    per_minute: dict[int, int] = {}
    for t in times:
        per_minute[int(t // 60)] = per_minute.get(int(t // 60), 0) + 1
    days = {int(t // 86400) for t in times}
    best = None
    for cut in itertools.product((False, True), repeat=len(PROVIDERS)):
        cost = sum(
            day * len(days) for (_, _, day, _, _), c in zip(PROVIDERS, cut, strict=True) if c
        )
        open_rpm = sum(rpm for (_, rpm, _, _, _), c in zip(PROVIDERS, cut, strict=True) if not c)
        cost += sum(min(n, open_rpm) for n in per_minute.values())
        best = cost if best is None else min(best, cost)
    return best or 0


async def simulate(times: list[float]) -> dict[str, Any]:
    midnight = calendar.timegm(
        dt.date.today().timetuple()
    )  # the simulated day starts at a UTC midnight
    async with trio.open_nursery() as nursery:
        fakes = {}
        for name, rpm, rpd, style, _ in PROVIDERS:
            fakes[name] = await nursery.start(serve_fake, name, rpm, rpd, style, midnight)
        paid = await nursery.start(serve_fake, "paid", 0, 0, "paid", midnight)
        config = lanes_config({n: f.base_url for n, f in fakes.items()}, paid.base_url)
        outcome: dict[str, float] = {"free": 0, "paid": 0, "failed": 0}  # counts, and "cost"
        # trio time 0 is the day's first second
        async with lanes.open_dispatcher(config, env=KEYS, epoch_now=midnight) as d:
            start = trio.current_time()

            async def job() -> None:
                try:
                    reply = await d.complete(
                        lanes.Job(messages=[{"role": "user", "content": "hi"}])
                    )
                    outcome["paid" if reply.route == "paid_fallback" else "free"] += 1
                    outcome.setdefault("cost", 0.0)
                    outcome["cost"] += reply.cost_usd
                except lanes.JobFailed:
                    outcome["failed"] += 1

            async with trio.open_nursery() as jobs:
                for t in times:
                    await trio.sleep_until(start + t)
                    jobs.start_soon(job)
        upstream = sum(len(f.log) for f in fakes.values())
        nursery.cancel_scope.cancel()
    return {
        **outcome,
        # every request to a free fake was answered or refused (429): the refused ones are those
        # not served free (the log's `behaviour` is "quota" for both)
        "requests_to_exhausted_providers": upstream - int(outcome["free"]),
        "upstream_requests": upstream,
    }


def lanes_config(free: dict[str, str], paid: str, **top: Any) -> lanes.Config:
    """The five free lanes (by name → base URL; the limits in config where `PROVIDERS` says our
    config knows them) and a paid lane, paid fallback allowed for interactive work."""
    tables = []
    for name, rpm, rpd, _, known in PROVIDERS:
        kind = (
            {"kind": "rate_limited", "rpm": rpm, "rpd": rpd} if known else {"kind": "rate_limited"}
        )
        tables.append(
            {
                "name": name,
                "module": "openai_compatible",
                "base_url": free[name],
                "api_key_env": "",
                "free_tier": kind,
                "models": [{"id": "m"}],
            }
        )
    tables.append(paid_lane("paid", paid, ["m"]))
    return lanes.load_config(
        {
            "lanes": tables,
            "default_deadline_s": 20,
            "policy": {"free_tier_fallback": "allow", "paid_ceiling_usd_per_day": 1000.0},
            "scoring": {"explore_rate": 0.0},
            **top,
        },
        env={},
    )


async def serve_fake(
    name: str, rpm: int, rpd: int, style: str, midnight: float, task_status=trio.TASK_STATUS_IGNORED
):
    """One fake provider answering model `m` under `rpm` a minute and `rpd` a day (trio's clock
    0 is `midnight`), reporting its limits as `style` says (`paid`: no limit)."""
    async with open_fake(name) as fake:
        fake.wall_offset = midnight - trio.current_time()
        fake.script(
            "m", quota(rpm, style=style, day_limit=rpd) if style != "paid" else quota(10**9)
        )
        task_status.started(fake)
        await trio.sleep_forever()


async def free_share(hours: float = 24.0) -> dict[str, Any]:
    """Run the simulated day in its own trio run on a virtual clock; compare with the oracle."""
    times = arrivals(hours)

    def run() -> dict[str, Any]:
        started = time.perf_counter()  # wall-clock: how long the simulation itself took
        result = trio.run(simulate, times, clock=trio.testing.MockClock(autojump_threshold=0))
        result["simulation_wall_s"] = time.perf_counter() - started  # wall-clock: as above
        return result

    result = await trio.to_thread.run_sync(run)
    best = oracle(times)
    total = len(times)
    return {
        "hours": hours,
        "jobs": total,
        **result,
        "free_share": result["free"] / total,
        "oracle_free": best,
        "oracle_free_share": best / total,
        "share_of_oracle": result["free"] / best if best else 1.0,
    }

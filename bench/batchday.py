"""Work that can wait, over a simulated day: a 5,000-item library batch (`submit_batch`, window
24 h) submitted at a UTC midnight beside freeshare's interactive traffic (Poisson arrivals with
bursts), over freeshare's five free fakes (per-minute and per-day quotas, reset at UTC midnight) and
a paid lane that interactive jobs may fall back to. All on trio's virtual clock in one process; the
day is run twice on the same arrivals — with the batch and without it — in two processes at once.

Measured: the batch's free share (items served free / items), its paid spend (a batch never pays),
the time its last item was served free, the interactive jobs' latency (wall and virtual) and free
share with and without the batch, and how closely the batch kept to the headroom.

The bound (`bench/batchbound.py` says what it assumes): the most batch items any scheduler could
serve free under lanes' headroom rule over the same interactive arrivals, those served free first
wherever a quota has room — the lesser of a max-flow bound (`bench/batchbound.py`) and a
mixed-integer program's (`bench/batchexact.py`). Nothing leaves 127.0.0.1.

`python -m bench.batchday` writes bench/results/batchday-DATE.json (about 8 minutes on 2 cores: each
of the batch's refused tries is a whole dispatcher call); `--quick` a 2-hour day of 1,000 items.
Diagnoses, not lanes' behaviour, changed in the batch's process only: `--backoff-cap S` (the
library batch's longest pause between tries) and `--concurrency N` (`[batch] concurrency`). `--raw
FILE` keeps every job and request; `--from-raw FILE` works the figures out again from it.
"""

from __future__ import annotations

import argparse
import calendar
import datetime as dt
import gzip
import json
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio
import trio.testing

import lanes
from bench.batchbound import arrivals_per_minute, bound, caps, obeyed, per_minute, replay
from bench.batchexact import tight_upper
from bench.freeshare import PROVIDERS, arrivals, lanes_config, serve_fake
from bench.peers import commit
from lanes.harness.configs import KEYS

ROOT = Path(__file__).resolve().parent.parent
ITEMS = 5000


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


# -- the simulated day -----------------------------------------------------------------------------
async def simulate(
    times: list[float], items: int, window_s: float, concurrency: int | None = None
) -> dict[str, Any]:
    """One day on the virtual clock (trio time 0 is a UTC midnight): interactive jobs at `times`,
    and, if `items`, a batch of that many submitted at 0 with `window_s` (and `concurrency`, if
    given: `[batch] concurrency`). Returns how every job ended and every request each fake
    received."""
    midnight = calendar.timegm(dt.date.today().timetuple())
    interactive: list[dict[str, Any]] = []
    batch: list[dict[str, Any]] = []
    async with trio.open_nursery() as nursery:
        fakes = {}
        for name, rpm, rpd, style, _ in PROVIDERS:
            fakes[name] = await nursery.start(serve_fake, name, rpm, rpd, style, midnight)
        paid = await nursery.start(serve_fake, "paid", 0, 0, "paid", midnight)
        settings = {"batch": {"concurrency": concurrency}} if concurrency else {}
        config = lanes_config({n: f.base_url for n, f in fakes.items()}, paid.base_url, **settings)
        async with lanes.open_dispatcher(config, env=KEYS, epoch_now=midnight) as d:
            start = trio.current_time()

            async def job(at: float) -> None:
                began, wall = trio.current_time(), time.perf_counter()  # wall: the job's own time
                row: dict[str, Any] = {"at": at}
                try:
                    reply = await d.complete(
                        lanes.Job(messages=[{"role": "user", "content": "hi"}])
                    )
                    row.update(
                        lane=reply.lane, paid=reply.route == "paid_fallback", cost=reply.cost_usd
                    )
                except lanes.JobFailed as exc:
                    row.update(error=exc.code)
                row.update(wall_s=time.perf_counter() - wall, virtual_s=trio.current_time() - began)
                interactive.append(row)

            async def traffic() -> None:
                async with trio.open_nursery() as jobs:
                    for t in times:
                        await trio.sleep_until(start + t)
                        jobs.start_soon(job, t)

            async def work() -> None:
                jobs = [
                    lanes.Job(messages=[{"role": "user", "content": f"batch item {i}"}])
                    for i in range(items)
                ]
                async with d.submit_batch(jobs, window=window_s) as running:
                    async for result in running.results():
                        row: dict[str, Any] = {"at": trio.current_time() - start}
                        if result.reply is not None:
                            reply = result.reply
                            row.update(
                                lane=reply.lane,
                                paid=reply.route == "paid_fallback",
                                cost=reply.cost_usd,
                            )
                        else:
                            row.update(error=result.error.code if result.error else "?")
                        batch.append(row)

            async with trio.open_nursery() as both:
                both.start_soon(traffic)
                if items:
                    both.start_soon(work)
            headroom = d.config.batch.headroom
            outcomes: dict[str, int] = {}
            for (_, _, _, outcome), n in d.statistics().tally.jobs.items():
                outcomes[outcome] = outcomes.get(outcome, 0) + n
        requests = {  # every request each fake received: (trio time, from the batch)
            name: [(r.at, _is_batch(r.body)) for r in f.log]
            for name, f in {**fakes, "paid": paid}.items()
        }
        nursery.cancel_scope.cancel()
    return {
        "interactive": interactive,
        "batch": batch,
        "requests": requests,
        "headroom": headroom,
        "jobs": outcomes,
        "start": start,
    }


def _is_batch(body: Mapping[str, Any]) -> bool:
    messages = body.get("messages") or [{}]
    return str(messages[0].get("content", "")).startswith("batch item")


def run_one(hours: float, items: int, concurrency: int | None = None) -> dict[str, Any]:
    """One day in its own trio run on a virtual clock (the child process's work)."""
    times = arrivals(hours)
    started = time.perf_counter()  # wall-clock: how long the simulation itself took
    clock = trio.testing.MockClock(autojump_threshold=0)
    result: dict[str, Any] = trio.run(
        simulate, times, items, hours * 3600, concurrency, clock=clock
    )
    result["simulation_wall_s"] = time.perf_counter() - started  # wall-clock: as above
    return result


# -- the figures (pure) ----------------------------------------------------------------------------
def interactive_figures(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    free = [r for r in rows if "lane" in r and not r["paid"]]
    wall = [r["wall_s"] * 1000 for r in rows]
    virtual = [r["virtual_s"] * 1000 for r in rows]
    return {
        "jobs": len(rows),
        "free": len(free),
        "free_share": len(free) / len(rows) if rows else None,
        "paid": sum(1 for r in rows if r.get("paid")),
        "paid_usd": sum(r.get("cost", 0.0) for r in rows if r.get("paid")),
        "failed": sum(1 for r in rows if "error" in r),
        "wall_p50_ms": percentile(wall, 50),
        "wall_p99_ms": percentile(wall, 99),
        "wall_mean_ms": statistics.fmean(wall) if wall else None,
        "virtual_p50_ms": percentile(virtual, 50),
        "virtual_p99_ms": percentile(virtual, 99),
        "virtual_max_ms": max(virtual, default=None),
    }


def batch_figures(run: Mapping[str, Any], items: int, window_s: float) -> dict[str, Any]:
    """The batch's figures against the bound over the same interactive arrivals."""
    headroom = run["headroom"]
    minutes = int(window_s // 60)
    rows = run["batch"]
    free = [r for r in rows if "lane" in r and not r["paid"]]
    arrived = arrivals_per_minute([r["at"] for r in run["interactive"]])
    limits = caps(headroom)
    best = bound(arrived, items=items, minutes=minutes, limits=limits)
    ceiling = bound({}, items=items, minutes=minutes, limits=limits)
    # the program's rule of free-first routing kept through the minute after the oracle's last
    # item (later minutes can only loosen the bound it gives: see bench/batchexact.py)
    horizon = minutes if best.finish_s is None else int(best.finish_s // 60) + 2
    tight = tight_upper(arrived, items=items, minutes=minutes, limits=limits, horizon=horizon)
    upper = min(best.upper, tight.upper)
    by_lane = per_minute([(r["at"], r["lane"]) for r in free])
    errors: dict[str, int] = {}
    for r in rows:
        if "error" in r:
            errors[r["error"]] = errors.get(r["error"], 0) + 1
    finish = max((r["at"] for r in free), default=None)
    active = {int(r["at"] // 60) for r in free}
    last: dict[str, float] = {}  # the batch's last item on each provider
    for r in free:
        last[r["lane"]] = max(last.get(r["lane"], 0.0), r["at"])
    before_done = sum(  # interactive jobs served free where the batch was not done yet
        1
        for r in run["interactive"]
        if "lane" in r and not r["paid"] and r["at"] < last.get(r["lane"], 0)
    )
    requests = run["requests"]
    return {
        "items": items,
        "window_s": window_s,
        "headroom": headroom,
        "free": len(free),
        "free_share": len(free) / items,
        "bound": upper,
        "bound_share": upper / items,
        "share_of_bound": len(free) / upper if upper else None,
        "max_flow": best.upper,
        "share_of_max_flow": len(free) / best.upper if best.upper else None,
        "tight": attrs.asdict(tight),
        "oracle": best.served,
        "share_of_oracle": len(free) / best.served if best.served else None,
        "ceiling": ceiling.upper,
        "paid": sum(1 for r in rows if r.get("paid")),
        "paid_usd": sum(r.get("cost", 0.0) for r in rows),
        "paid_requests": sum(from_batch for _, from_batch in requests["paid"]),
        # the dispatcher's jobs, batch tries and interactive jobs alike, by how each ended
        "jobs": run["jobs"],
        "tries": sum(run["jobs"].values()) - len(run["interactive"]),
        "minutes_to_finish": None if finish is None else int(finish // 60) + 1,
        "minutes_served": len(active),
        "interactive_before_done": before_done,
        "oracle_interactive_before_done": ceiling.upper - best.served,
        "errors": errors,
        "finish_s": finish,
        "oracle_finish_s": best.finish_s,
        "ended_s": max((r["at"] for r in rows), default=None),
        "per_provider": {
            name: {
                "served": sum(by_lane.get(name, {}).values()),
                "oracle": best.per_provider[name],
                "r": r,
                "d": d,
                "max_in_a_minute": max(by_lane.get(name, {}).values(), default=0),
                "requests": sum(from_batch for _, from_batch in requests[name]),
                **obeyed(requests[name], replay(requests[name], rpm, rpd), r, d),
            }
            for name, (rpm, rpd, r, d) in limits.items()
        },
    }


def upstream_figures(run: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """Per fake: requests from the batch and from interactive jobs, and how many of each its quota
    refused (429)."""
    limits = {name: (rpm, rpd) for name, rpm, rpd, _, _ in PROVIDERS}
    found = {}
    for name, requests in run["requests"].items():
        answers = replay(requests, *limits.get(name, (0, 0)))
        pairs = list(zip(requests, answers, strict=True))
        found[name] = {
            "batch": sum(b for (_, b), _ in pairs),
            "interactive": sum(not b for (_, b), _ in pairs),
            "batch_refused": sum(b for (_, b), a in pairs if a != "ok"),
            "interactive_refused": sum(not b for (_, b), a in pairs if a != "ok"),
        }
    return found


async def measure(quick: bool = False, changed: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The day with the batch and without it, in two processes at once: every job and request of
    both (`figures` makes the figures of them). `changed` (a diagnosis, not lanes' behaviour), in
    the batch's process: `backoff_cap_s`, the library batch's longest pause between tries, and
    `concurrency`, `[batch] concurrency`."""
    hours, items = (2.0, 1000) if quick else (24.0, ITEMS)
    changed = {k: v for k, v in (changed or {}).items() if v is not None}

    async def child(items: int, into: dict[str, Any]) -> None:
        command = [
            sys.executable,
            "-m",
            "bench.batchday",
            "--one",
            "--hours",
            str(hours),
            "--items",
            str(items),
        ]
        if items and "backoff_cap_s" in changed:
            command += ["--backoff-cap", str(changed["backoff_cap_s"])]
        if items and "concurrency" in changed:
            command += ["--concurrency", str(changed["concurrency"])]
        done = await trio.run_process(command, capture_stdout=True, cwd=str(ROOT))
        into["with_batch" if items else "alone"] = json.loads(done.stdout)

    runs: dict[str, Any] = {
        "date": dt.date.today().isoformat(),
        "commit": commit(),
        "hours": hours,
        "items": items,
        "changed": changed,
    }
    async with trio.open_nursery() as nursery:
        nursery.start_soon(child, items, runs)
        nursery.start_soon(child, 0, runs)
    return runs


def figures(runs: Mapping[str, Any]) -> dict[str, Any]:
    """The figures of a day's two runs (`measure`'s, or kept with `--raw`)."""
    with_batch, alone = runs["with_batch"], runs["alone"]
    return {
        "date": runs["date"],
        "commit": runs["commit"],
        "hours": runs["hours"],
        "runs": 1,
        "changed": runs["changed"],
        "batch": batch_figures(with_batch, runs["items"], runs["hours"] * 3600),
        "interactive_with_batch": interactive_figures(with_batch["interactive"]),
        "interactive_alone": interactive_figures(alone["interactive"]),
        "simulation_wall_s": {
            "with_batch": with_batch["simulation_wall_s"],
            "alone": alone["simulation_wall_s"],
        },
        "upstream": {"with_batch": upstream_figures(with_batch), "alone": upstream_figures(alone)},
    }


async def run(
    quick: bool, changed: Mapping[str, Any] | None = None, raw: Path | None = None
) -> dict[str, Any]:
    """`measure`'s figures, saved (see `save`); with `raw`, every job and request of both runs
    kept there too (gzipped JSON)."""
    runs = await measure(quick, changed)
    if raw is not None:
        await trio.Path(raw).write_bytes(gzip.compress(json.dumps(runs).encode()))
    return save(figures(runs))


def name(data: Mapping[str, Any]) -> str:
    """batchday-DATE[-quick][-backoffS][-concurrencyN].json (quick: a day under 24 h)."""
    changed = data["changed"]
    tail = "-quick" if data["hours"] < 24 else ""
    if "backoff_cap_s" in changed:
        tail += f"-backoff{changed['backoff_cap_s']:g}"
    if "concurrency" in changed:
        tail += f"-concurrency{changed['concurrency']}"
    return f"batchday-{data['date']}{tail}.json"


def save(data: dict[str, Any]) -> dict[str, Any]:
    """Write bench/results/`name(data)`."""
    (ROOT / "bench" / "results" / name(data)).write_text(json.dumps(data, indent=2))
    return data


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 simulated hours, 1,000 items")
    parser.add_argument(
        "--backoff-cap",
        type=float,
        default=None,
        metavar="S",
        help="diagnosis: the library batch's longest pause between tries (lanes': 60 s)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=None,
        metavar="N",
        help="diagnosis: the batch's `[batch] concurrency`, instead of the default 4",
    )
    parser.add_argument(
        "--raw",
        type=Path,
        default=None,
        metavar="FILE",
        help="keep every job and request of both runs here (gzipped JSON)",
    )
    parser.add_argument(
        "--from-raw",
        type=Path,
        default=None,
        metavar="FILE",
        help="work the figures out again from a --raw FILE, without the day",
    )
    parser.add_argument("--one", action="store_true", help="(internal) one run, JSON to stdout")
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--items", type=int, default=ITEMS)
    args = parser.parse_args()
    if args.one:
        if args.backoff_cap is not None:  # a diagnosis: what the batch does without the long pause
            from lanes._core.batch import runner  # the rule library batches share

            runner.MAX_BACKOFF_S = args.backoff_cap
        json.dump(run_one(args.hours, args.items, args.concurrency), sys.stdout)
    elif args.from_raw is not None:
        kept_runs = json.loads(gzip.decompress(args.from_raw.read_bytes()))
        print(json.dumps(save(figures(kept_runs)), indent=2))
    else:
        changes = {"backoff_cap_s": args.backoff_cap, "concurrency": args.concurrency}
        print(json.dumps(trio.run(run, args.quick, changes, args.raw), indent=2))

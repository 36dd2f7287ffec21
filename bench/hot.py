"""The hot path alone: lanes beside the limit, interleaved, several rounds — and, on request, a
py-spy profile of `lanes serve` under load.

`python -m bench.hot [--rounds 3] [--seconds 5]` runs, per round and for each of `limit` and `lanes`
(each peer going first in turn): JSON and SSE throughput at 64 connections, and the SSE
first byte and JSON latency at 8. It prints each round's ratios lanes / limit — the figures
`make bench` reports once, measured here side by side so that the noise of a shared machine falls
on both peers alike — and writes them to `bench/results/hot-<date>.json` with `--floor --docs`
(the run the page then shows), else to `hot-<date>-draft.json`; a name taken already gets the
commit after it (`bench/publish.py`).

`python -m bench.hot --profile json|sse --py-spy PATH [--peer lanes|floor|limit] [--concurrency 32]
[--seconds 20] [--out FILE] [--samples FILE]` samples `lanes serve` (or the limit) with py-spy —
not a dependency: `pip install py-spy` anywhere and give its path — while the load runs, and
writes the summary `bench.flame.summarise` makes of the samples to `--out` (and py-spy's raw
samples to `--samples`, if given).

`python -m bench.hot --memory` writes (to `bench/results/memory-<date>.json`) the RSS of the floor
and of `lanes serve`, idle, warm and with 1,000 SSE streams held open (as `make bench` measures
it).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import sys
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

import trio

from bench import flame, peers, publish
from bench.guard import guard_line, published_hot
from bench.load import body, run_load, summary

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("fast", "slow")


MEASURES = ("json_c8", "json_c64", "sse_c8", "sse_c64")


async def measure(
    pair: list[peers.Peer], seconds: float, slices: int, only: tuple[str, ...] = MEASURES
) -> dict[str, Any]:
    """Each measure in `slices` short turns that alternate between the peers, so a neighbour's
    load on the shared machine falls on both alike; the CPU each peer used per request too."""
    for p in pair:
        url = p.url + "/chat/completions"
        await run_load(url, concurrency=8, total=50, body=body())  # warm-up
        await run_load(url, concurrency=8, total=50, stream=True, body=body())
    rows: dict[str, dict[str, Any]] = {p.name: {} for p in pair}
    for stream in (False, True):
        kind = "sse" if stream else "json"
        for conc in (8, 64):
            if f"{kind}_c{conc}" not in only:
                continue
            got: dict[str, list[Any]] = {p.name: [[], 0.0, 0.0] for p in pair}
            for i in range(slices):
                for p in pair[i % len(pair) :] + pair[: i % len(pair)]:  # each goes first in turn
                    before = p.own_cpu_s()
                    samples, wall = await run_load(
                        p.url + "/chat/completions",
                        concurrency=conc,
                        duration_s=seconds / slices,
                        stream=stream,
                        body=body(),
                    )
                    entry = got[p.name]
                    entry[0] += samples
                    entry[1] += wall
                    entry[2] += p.own_cpu_s() - before
            for name, (samples, wall, cpu) in got.items():
                row = summary(samples, wall)
                row["cpu_ms_per_request"] = 1000 * cpu / max(1, row["ok"])
                rows[name][f"{kind}_c{conc}"] = row
    return rows


#: each ratio: its name, the measure and the figure it compares
RATIOS = (
    ("json_c64", "json_c64", "rps"),
    ("sse_c64", "sse_c64", "rps"),
    ("sse_c8_ttfb_p50", "sse_c8", "ttfb_p50_ms"),
    ("json_c8_p50", "json_c8", "p50_ms"),
    ("json_cpu", "json_c64", "cpu_ms_per_request"),
    ("sse_cpu", "sse_c64", "cpu_ms_per_request"),
    ("sse_c8_cpu", "sse_c8", "cpu_ms_per_request"),
)


def ratios(limit: dict[str, Any], ours: dict[str, Any]) -> dict[str, float]:
    return {
        name: ours[measure][figure] / limit[measure][figure]
        for name, measure, figure in RATIOS
        if measure in ours and measure in limit
    }


async def compare(
    rounds: int,
    seconds: float,
    slices: int,
    only: tuple[str, ...] = MEASURES,
    with_floor: bool = False,
) -> dict[str, Any]:
    out: dict[str, Any] = {"date": dt.date.today().isoformat(), "rounds": []}
    with tempfile.TemporaryDirectory(prefix="lanes-hot-") as tmp:
        workdir = Path(tmp)
        async with (
            peers.fake_upstream("all", workdir) as (upstream, _),
            peers.limit(upstream, workdir) as limit,
            peers.ours(upstream, workdir, models=MODELS) as ours,
            contextlib.AsyncExitStack() as stack,
        ):
            group = [limit, ours]
            if with_floor:
                group.append(await stack.enter_async_context(peers.floor(upstream, workdir)))
            for i in range(rounds):
                row = await measure(group, seconds, slices, only)
                row["ratios"] = ratios(row["limit"], row["lanes"])
                if with_floor:
                    row["floor_ratios"] = ratios(row["limit"], row["floor"])
                out["rounds"].append(row)
                print(_line(i, row), file=sys.stderr, flush=True)
                if with_floor:
                    print(_line(i, row, "floor"), file=sys.stderr, flush=True)
    return out


async def streams_held(p: peers.Peer, quick: bool) -> dict[str, Any]:
    """RSS with many concurrent SSE streams held open (the `slow` model streams for ~6 s)."""
    count = 200 if quick else 1000
    rss = []
    async with trio.open_nursery() as nursery:

        async def sample() -> None:
            await trio.sleep(3.0)
            rss.append(p.rss_mb())

        nursery.start_soon(sample)
        samples, _ = await run_load(
            p.url + "/chat/completions",
            concurrency=count,
            total=count,
            stream=True,
            headers=p.headers,
            body=body("slow"),
        )
    return {"streams": count, "ok": sum(s.status == 200 for s in samples), "rss_mb": rss[0]}


async def memory(streams: int) -> dict[str, Any]:
    """Each peer's RSS idle (started, nothing asked yet: as `make bench` reads it), after a
    warm-up, and with `streams` SSE streams held open — the
    figures `make bench` reports, for lanes and the floor alone."""

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="lanes-hot-") as tmp:
        workdir = Path(tmp)
        async with peers.fake_upstream("all", workdir) as (upstream, _):
            for name in ("floor", "lanes"):
                async with (
                    peers.ours(upstream, workdir, models=MODELS)
                    if name == "lanes"
                    else peers.floor(upstream, workdir)
                ) as p:
                    url, idle = p.url + "/chat/completions", p.rss_mb()
                    await run_load(url, concurrency=8, total=50, body=body())  # warm-up
                    warm = p.rss_mb()
                    held = await streams_held(p, quick=streams < 1000)
                    out[name] = {"idle_rss_mb": idle, "warm_rss_mb": warm, **held}
                    print(f"{name}: {out[name]}", file=sys.stderr, flush=True)
    return out


def _line(i: int, row: dict[str, Any], peer: str = "lanes") -> str:
    r, lim, ours = row["ratios"], row["limit"], row[peer]
    if peer != "lanes":
        r = row[f"{peer}_ratios"]
    if set(ours) != set(MEASURES) or peer != "lanes":
        return f"round {i + 1}, {peer}/limit: " + " · ".join(
            f"{name} {ours[m][f]:.2f}/{lim[m][f]:.2f} = {r[name]:.2f}x"
            for name, m, f in RATIOS
            if name in r
        )
    return (
        f"round {i + 1}: JSON c64 {ours['json_c64']['rps']:.0f}/{lim['json_c64']['rps']:.0f} req/s "
        f"= {r['json_c64']:.2f}x · SSE c64 {ours['sse_c64']['rps']:.0f}/"
        f"{lim['sse_c64']['rps']:.0f} = {r['sse_c64']:.2f}x · SSE first byte c8 p50 "
        f"{ours['sse_c8']['ttfb_p50_ms']:.1f}/{lim['sse_c8']['ttfb_p50_ms']:.1f} ms "
        f"= {r['sse_c8_ttfb_p50']:.2f}x · JSON c8 p50 {ours['json_c8']['p50_ms']:.1f}/"
        f"{lim['json_c8']['p50_ms']:.1f} ms = {r['json_c8_p50']:.2f}x · CPU per request "
        f"JSON {ours['json_c64']['cpu_ms_per_request']:.2f}/"
        f"{lim['json_c64']['cpu_ms_per_request']:.2f} ms, SSE "
        f"{ours['sse_c64']['cpu_ms_per_request']:.2f}/{lim['sse_c64']['cpu_ms_per_request']:.2f} ms"
    )


async def profile(
    kind: str,
    py_spy: str,
    concurrency: int,
    seconds: float,
    out: Path,
    peer: str,
    samples_to: Path | None,
) -> None:
    with tempfile.TemporaryDirectory(prefix="lanes-hot-") as tmp:
        workdir = Path(tmp)
        async with (
            peers.fake_upstream("all", workdir) as (upstream, _),
            (
                peers.ours(upstream, workdir, models=MODELS)
                if peer == "lanes"
                else peers.floor(upstream, workdir)
                if peer == "floor"
                else peers.limit(upstream, workdir)
            ) as ours,
        ):
            assert ours.process is not None
            stream = kind == "sse"
            url = ours.url + "/chat/completions"
            await run_load(url, concurrency=8, total=100, stream=stream, body=body())  # warm-up
            raw = samples_to or workdir / "samples.collapsed"
            spy = await trio.lowlevel.open_process(
                [
                    py_spy,
                    "record",
                    "--pid",
                    str(ours.process.pid),
                    "--duration",
                    str(int(seconds)),
                    "--rate",
                    "250",
                    "--format",
                    "raw",
                    "--nolineno",
                    "--output",
                    str(raw),
                ]
            )
            samples, wall = await run_load(
                url, concurrency=concurrency, duration_s=seconds + 1.0, stream=stream, body=body()
            )
            await spy.wait()
            who = {"lanes": "lanes serve", "floor": "the floor"}.get(peer, "the limit")
            header = (
                f"{who} under {kind.upper()} load "
                f"at c={concurrency} for {seconds:g} s: {summary(samples, wall)['rps']:.0f} req/s "
                "while sampled (py-spy, 250 Hz)"
            )
            text = await trio.Path(raw).read_text()
            await trio.Path(out).write_text(flame.summarise(text, header=header))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--slices", type=int, default=6)
    parser.add_argument("--profile", choices=("json", "sse"))
    parser.add_argument("--py-spy", default="py-spy")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--peer", choices=("lanes", "floor", "limit"), default="lanes")
    parser.add_argument("--samples", type=Path, help="keep py-spy's raw samples here")
    parser.add_argument(
        "--floor", action="store_true", help="measure the floor (bench/floor.py) beside them"
    )
    parser.add_argument(
        "--only", nargs="+", choices=MEASURES, default=list(MEASURES), help="measure only these"
    )
    parser.add_argument(
        "--memory", action="store_true", help="RSS idle and with 1,000 streams held, and exit"
    )
    parser.add_argument(
        "--docs", action="store_true", help="with --floor: rewrite docs/benchmarks.md's section"
    )
    args = parser.parse_args()
    if args.memory:
        rss = trio.run(memory, 1000)
        path = ROOT / "bench" / "results" / f"memory-{dt.date.today().isoformat()}.json"
        path.write_text(json.dumps(rss, indent=2))
        print(f"bench: wrote {path.relative_to(ROOT)}", file=sys.stderr)
        return
    if args.profile:
        out = args.out or ROOT / "bench" / "results" / f"profile-{args.profile}.txt"
        trio.run(
            partial(
                profile,
                args.profile,
                args.py_spy,
                args.concurrency,
                args.seconds,
                out,
                args.peer,
                args.samples,
            )
        )
        print(f"bench: wrote {out}", file=sys.stderr)
        return
    head = peers.commit()  # when the run starts: what it measures
    data = trio.run(compare, args.rounds, args.seconds, args.slices, tuple(args.only), args.floor)
    if set(args.only) != set(MEASURES):  # a partial run never replaces the day's full one
        print("bench: a partial run (--only): no file written", file=sys.stderr)
        return
    # A run that does not publish (`--docs`) is written beside the day's published one, as a
    # draft; neither writes over another run's figures (`publish.result_path`).
    stem = f"hot-{data['date']}{'' if args.floor and args.docs else '-draft'}"
    path = publish.result_path(ROOT / "bench" / "results", stem, head)
    with contextlib.suppress(ValueError):  # where the page says the figures are
        data["source"] = str(path.relative_to(ROOT))
    if args.floor:
        print(guard_line(data, published_hot(before=data["date"])))
    path.write_text(json.dumps(data, indent=2))
    print(f"bench: wrote {path.relative_to(ROOT)}", file=sys.stderr)
    if args.floor and args.docs:
        from bench.report import rewrite_section
        from bench.sections import hot_section

        if rewrite_section(hot_section(data), data["date"]):
            print("bench: rewrote the hot path's section of docs/benchmarks.md", file=sys.stderr)


if __name__ == "__main__":
    main()

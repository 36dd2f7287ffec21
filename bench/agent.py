"""Agent-sized requests: the CPU each peer spends per request as the body grows — a coding agent's
turn (a long system prompt, tool schemas, the history with tool calls and their results as text)
of 1, 32, 128 and 512 KB — through the chat completions, Messages and Responses doors, answered
whole (JSON) and streamed (SSE), one request at a time and eight at once.

`python -m bench.agent [--rounds 3] [--requests 40] [--sizes 1,32,128,512] [--doors ...]
[--kinds json,sse] [--concurrency 1,8] [--peers ...]` runs, per round and cell (door × kind ×
concurrency × size), the same requests through each peer in turn, each going first in turn, so a
neighbour's load on the shared machine falls on all alike. Peers: `direct` (the fake upstream
itself: the latency baseline), `floor` (`bench/floor.py`), `floor-msgspec` (the floor reading
and writing JSON with msgspec), `lanes`, `litellm` (bench/.venv-litellm) and `portkey` (the
Portkey gateway on Node, bench/.portkey) — each skipped, with its reason, where it is not
installed or does not serve a door. CPU per request comes from each process's CPU clock, to the
nanosecond (the peer's process and its children); latency is the client's, p50 per cell, and
"added" is a peer's p50 less the direct one's in the same round — at a translated door, lanes'
and the floors' less `direct` timed on the chat request lanes sends upstream (`sent_upstream`,
which the floors send too), since LiteLLM and Portkey forward the body as it came. Then the
resident memory of each peer idle and with 64 streamed 512 KB requests in flight. It writes
`bench/results/agent-<date>.json` (`-<commit>` after it where the day's name is taken) and the
chart `docs/benchmarks-agent.svg` (and, with `--docs`, docs/benchmarks.md's agent section, which
`bench/agentreport.py` makes of the figures; `make bench` writes it with the rest).
Nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import statistics
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import trio

from bench import peers, publish
from bench.agentbodies import agent_body, sent_upstream
from bench.load import Sample, percentile, run_load

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
SIZES = (1, 32, 128, 512)  # KB
DOORS = {"chat": "/chat/completions", "messages": "/messages", "responses": "/responses"}
KINDS = ("json", "sse")
CONCURRENCY = (1, 8)
PEERS = ("direct", "floor", "floor-msgspec", "lanes", "litellm", "portkey")
#: the fake upstream's models: answers at once; streams a chunk every 0.6 s; and two no request
#: has used before `cold`'s (answers after 5 s; streams for 5 s)
MODELS = ("fast", "slow", "cold-json", "cold-sse")
#: `direct` timed on the chat request lanes sends upstream at a translated door (`sent_upstream`)
SENT = "direct-sent"
HELD = 64  # streamed 512 KB requests in flight for the memory figure, and requests to a cold model

#: Doors a peer does not serve, and why (measured on 2026-12-04: its answer to one request).
UNSERVED = {
    ("portkey", "messages"): "Portkey 1.15.2 serves /v1/messages only for Anthropic-shaped "
    "providers (to an OpenAI-compatible one: 'messages is not supported by openai')",
}
#: What a peer does at a door that is not what lanes does there (a translation to chat).
NOTES = {
    ("floor-msgspec", "every door"): "the floor with its JSON read and written by msgspec, as "
    "lanes writes it and reads it beneath its strict checks (`json` in the floor, as issue 45 set "
    "it): the least on this stack, with none of lanes' guarantees",
    ("floor", "Messages and Responses"): "the floor translates with lanes' own pure "
    "translations (the body into the chat request lanes sends, the answer or each chunk of a "
    "stream back into the door's shape) and does nothing else lanes does",
    ("portkey", "responses"): "Portkey passes a Responses request to the upstream's own "
    "/responses as it came (no translation: the fake upstream answers in chat's shape)",
}


def missing(name: str) -> str | None:
    """Why peer `name` can not run here (None: it can)."""
    if name == "litellm" and not peers.litellm_available():
        return "LiteLLM is not installed (make bench installs it into bench/.venv-litellm)"
    if name == "portkey":
        return peers.portkey_missing()
    return None


@contextlib.asynccontextmanager
async def opened(name: str, upstream: str, workdir: Path) -> AsyncIterator[peers.Peer]:
    if name == "direct":
        yield peers.Peer("direct", upstream, None)
    elif name in ("floor", "floor-msgspec"):
        async with peers.floor(upstream, workdir, fast=name == "floor-msgspec") as p:
            yield p
    elif name == "lanes":
        async with peers.ours(upstream, workdir, models=MODELS) as p:
            yield p
    elif name == "litellm":
        models = dict.fromkeys(MODELS, 30.0)
        async with peers.litellm(upstream, workdir, models=models, provider="custom_openai") as p:
            yield p
    else:
        async with peers.portkey(upstream, workdir) as p:
            yield p


def _p50_ms(samples: list[Sample], field: str) -> float:
    return percentile([getattr(s, field) for s in samples], 50) * 1000


async def cell(
    peer: peers.Peer, door: str, kind: str, concurrency: int, body: dict[str, Any], requests: int
) -> dict[str, Any]:
    """One peer's figures for one cell: CPU ms per request (not for `direct`), p50 latency and
    first byte; or `error` when an answer was not 200."""
    before = peer.cpu_s() if peer.process is not None else None
    samples, _ = await run_load(
        peer.url + DOORS[door],
        concurrency=concurrency,
        total=requests,
        stream=kind == "sse",
        headers=peer.headers,
        body=body,
    )
    bad = sorted({s.status for s in samples if s.status != 200})
    if bad:
        count = sum(s.status != 200 for s in samples)
        return {"error": f"{count} of {len(samples)} answers not 200 ({bad})"}
    out = {"p50_ms": _p50_ms(samples, "latency_s"), "ttfb_p50_ms": _p50_ms(samples, "ttfb_s")}
    if before is not None:
        out["cpu_ms"] = 1000 * (peer.cpu_s() - before) / len(samples)
    return out


async def cold(p: peers.Peer) -> dict[str, Any]:
    """`HELD` requests at once to a model the peer has not heard from yet, one answering after
    5 s (JSON) and one streaming for 5 s (SSE): the median and slowest finish, in seconds (the
    upstream's own time, direct: about 5 s)."""
    out: dict[str, Any] = {}
    for kind in KINDS:
        samples, _ = await run_load(
            p.url + DOORS["chat"],
            concurrency=HELD,
            total=HELD,
            stream=kind == "sse",
            headers=p.headers,
            body={**agent_body(1), "model": f"cold-{kind}"},
            timeout_s=120,
        )
        done = [s.latency_s for s in samples if s.status == 200]
        out[kind] = {
            "ok": len(done),
            "median_s": statistics.median(done) if done else None,
            "max_s": max(done, default=None),
        }
    return out


def load_average() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


async def held(p: peers.Peer, body: dict[str, Any]) -> dict[str, Any]:
    """RSS (MiB) idle, then its most while `HELD` streamed requests of `body` to the `slow` model
    (10 chunks, 0.6 s apart) are in flight."""
    idle, most = p.rss_mb(), 0.0
    done = trio.Event()

    async def sample() -> None:
        nonlocal most
        while not done.is_set():
            most = max(most, p.rss_mb() or 0.0)
            await trio.sleep(0.25)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sample)
        samples, _ = await run_load(
            p.url + DOORS["chat"],
            concurrency=HELD,
            total=HELD,
            stream=True,
            headers=p.headers,
            body={**body, "model": "slow"},
            timeout_s=120,
        )
        done.set()
    return {"idle_mb": idle, "held_mb": most, "ok": sum(s.status == 200 for s in samples)}


async def run(
    rounds: int,
    requests: int,
    sizes: list[int],
    *,
    doors: tuple[str, ...] = tuple(DOORS),
    kinds: tuple[str, ...] = KINDS,
    concurrency: tuple[int, ...] = CONCURRENCY,
    names: tuple[str, ...] = PEERS,
    cold_models: bool = True,
) -> dict[str, Any]:
    """Every cell through every peer, `rounds` times; the figures (`figures`); then each peer's
    memory with requests held (`held`) and its answers from a cold model (`cold`)."""
    bodies = {(door, kb): agent_body(kb, door) for door in doors for kb in sizes}
    raw: dict[str, Any] = {}
    skipped = {n: why for n in names if (why := missing(n)) is not None}
    failed: dict[str, str] = {}  # "peer door kind": the first error seen there
    loads = [load_average()]
    rss: dict[str, Any] = {}
    herd: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="lanes-agent-") as tmp:
        workdir = Path(tmp)
        async with (
            peers.fake_upstream("all", workdir) as (upstream, _),
            contextlib.AsyncExitStack() as stack,
        ):
            group = []
            for name in names:
                if name not in skipped:
                    group.append(await stack.enter_async_context(opened(name, upstream, workdir)))
            for p in group:  # warm-up: every door each peer serves, both kinds
                for door in doors:
                    if (p.name, door) not in UNSERVED:
                        for kind in kinds:
                            await cell(p, door, kind, 1, bodies[door, sizes[0]], 10)
            turn = 0
            for i in range(rounds):
                for door in doors:
                    for kind in kinds:
                        for conc in concurrency:
                            for kb in sizes:
                                order = group[turn % len(group) :] + group[: turn % len(group)]
                                turn += 1
                                n = requests * (2 if kb <= 32 else 1)
                                if door != "chat" and "direct" in names and "lanes" in names:
                                    direct = next(p for p in group if p.name == "direct")
                                    sent = sent_upstream(door, bodies[door, kb], kind)
                                    got = await cell(direct, "chat", kind, conc, sent, n)
                                    key = f"{door} {kind} c{conc} {kb}"
                                    raw.setdefault(key, {}).setdefault(SENT, []).append(got)
                                for p in order:
                                    where = f"{p.name} {door} {kind}"
                                    if (p.name, door) in UNSERVED or where in failed:
                                        continue
                                    got = await cell(p, door, kind, conc, bodies[door, kb], n)
                                    if "error" in got:
                                        failed[where] = got["error"]
                                        continue
                                    key = f"{door} {kind} c{conc} {kb}"
                                    raw.setdefault(key, {}).setdefault(p.name, []).append(got)
                                print(_progress(i, door, kind, conc, kb, raw), file=sys.stderr)
                loads.append(load_average())
            largest = agent_body(sizes[-1])
            for p in group:
                if p.process is not None:
                    rss[p.name] = await held(p, largest)
                    print(f"{p.name}: {rss[p.name]}", file=sys.stderr, flush=True)
            for p in group:  # last: each cold model's first use is here
                if cold_models:
                    herd[p.name] = await cold(p)
                    print(f"{p.name}: {herd[p.name]}", file=sys.stderr, flush=True)
            loads.append(load_average())
    lengths = {f"{door} {kb}": len(json.dumps(b)) for (door, kb), b in bodies.items()}
    result = figures(raw, lengths, sizes)
    result.update(
        date=dt.date.today().isoformat(),
        rounds=rounds,
        requests=requests,
        cpu_clock="process",  # `peers.process_cpu_s`: how `agentreport` says CPU was read
        floor="translates",  # at the translated doors (`bench/floor.py`): for `agentreport`
        load_average=loads,
        versions={n: peers.version(n) for n in ("lanes", "litellm", "portkey") if n in names},
        skipped=skipped,
        failed=failed,
        unserved={f"{p} {d}": why for (p, d), why in UNSERVED.items() if p in names},
        notes={f"{p} {d}": why for (p, d), why in NOTES.items() if p in names},
        rss=rss,
        cold=herd,
        held=HELD,
        held_kb=sizes[-1],
        raw=raw,
    )
    return result


def _progress(i: int, door: str, kind: str, conc: int, kb: int, raw: dict[str, Any]) -> str:
    got = raw.get(f"{door} {kind} c{conc} {kb}", {})
    cpu = ", ".join(
        f"{name} {runs[-1].get('cpu_ms', runs[-1]['p50_ms']):.2f}" for name, runs in got.items()
    )
    return f"round {i + 1} {door} {kind} c={conc} {kb:>4} KB: {cpu} (ms; direct: p50)"


def figures(raw: dict[str, Any], lengths: dict[str, int], sizes: list[int]) -> dict[str, Any]:
    """Medians over the rounds per cell and peer; the ratios of lanes to each peer; each peer's
    growth per KB (the slope between the smallest and the largest body); and the added latency
    (a peer's p50 less the direct one's, round by round)."""
    cells: dict[str, Any] = {}
    for key, by_peer in raw.items():
        door, kind, conc, kb = key.split()
        direct = by_peer.get("direct", [])
        row: dict[str, Any] = {"bytes": lengths[f"{door} {kb}"], "peers": {}}
        for name, runs in by_peer.items():
            fig: dict[str, float] = {}
            for field in ("cpu_ms", "p50_ms", "ttfb_p50_ms"):
                if all(field in r for r in runs):
                    fig[field] = statistics.median(r[field] for r in runs)
            if name not in ("direct", SENT) and len(direct) == len(runs):
                for field in ("p50_ms", "ttfb_p50_ms"):
                    fig[f"added_{field}"] = statistics.median(
                        r[field] - d[field] for r, d in zip(runs, direct, strict=True)
                    )
            sent = by_peer.get(SENT, [])  # what lanes, and the floor that translates, send
            if name in ("lanes", "floor", "floor-msgspec") and len(sent) == len(runs):
                for field in ("p50_ms", "ttfb_p50_ms"):
                    fig[f"added_sent_{field}"] = statistics.median(
                        r[field] - d[field] for r, d in zip(runs, sent, strict=True)
                    )
            row["peers"][name] = fig
        lanes = row["peers"].get("lanes", {}).get("cpu_ms")
        row["lanes_over"] = {
            name: lanes / fig["cpu_ms"]
            for name, fig in row["peers"].items()
            if lanes and name != "lanes" and fig.get("cpu_ms")
        }
        cells[key] = row
    growth: dict[str, dict[str, float]] = {}
    small, large = sizes[0], sizes[-1]
    for key, row in cells.items():
        door, kind, conc, kb = key.split()
        if int(kb) != large or f"{door} {kind} {conc} {small}" not in cells:
            continue
        first = cells[f"{door} {kind} {conc} {small}"]
        span_kb = (row["bytes"] - first["bytes"]) / 1024
        growth[f"{door} {kind} {conc}"] = {
            name: 1000 * (fig["cpu_ms"] - first["peers"][name]["cpu_ms"]) / span_kb
            for name, fig in row["peers"].items()
            if "cpu_ms" in fig and "cpu_ms" in first["peers"].get(name, {})
        }
    return {"sizes": sizes, "cells": cells, "us_per_kb": growth}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=40, help="a cell's (twice up to 32 KB)")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--doors", default=",".join(DOORS))
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--concurrency", default=",".join(map(str, CONCURRENCY)))
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--docs", action="store_true", help="rewrite docs/benchmarks.md's agent section too"
    )
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    # the commit the run starts from (a commit made while it runs is not what it measured)
    head = peers.commit()
    result = trio.run(
        lambda: run(
            args.rounds,
            args.requests,
            sizes,
            doors=tuple(args.doors.split(",")),
            kinds=tuple(args.kinds.split(",")),
            concurrency=tuple(int(c) for c in args.concurrency.split(",")),
            names=tuple(args.peers.split(",")),
        )
    )
    result["commit"] = head
    out = args.out or publish.result_path(RESULTS, f"agent-{result['date']}", head)
    with contextlib.suppress(ValueError):  # where the report says the figures are
        result["source"] = str(out.resolve().relative_to(ROOT))
    out.write_text(json.dumps(result, indent=2) + "\n")
    from bench import agentreport

    chart = agentreport.chart(result)
    for line in agentreport.summary(result):
        print(line)
    print(f"bench: wrote {out}" + (f" and {chart}" if chart else ""), file=sys.stderr)
    if args.docs:
        from bench.report import rewrite_section

        if rewrite_section(agentreport.section(result), result["date"]):
            print("bench: rewrote the agent section of docs/benchmarks.md", file=sys.stderr)


if __name__ == "__main__":
    main()

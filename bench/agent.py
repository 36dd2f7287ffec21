"""Agent-sized requests: the CPU lanes spends per request against the floor's (`bench/floor.py`)
as the body grows — a coding agent's turn (a long system prompt, tool schemas, the history with
tool calls and their results as text) of 1, 32, 128 and 512 KB, on the chat door, JSON, one at a
time.

`python -m bench.agent [--rounds 3] [--requests 40] [--sizes 1,32,128,512]` runs, per round and
size, the same requests through each peer in turn (each going first in turn, so a neighbour's load
on the shared machine falls on both alike), reads each peer's CPU from /proc, and prints the CPU
per request, the ratio lanes / floor and each one's growth per KB (the slope between the smallest
and the largest body). It writes `bench/results/agent-<date>.json`. Nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import trio

from bench import peers
from bench.hot import MODELS, cpu_s
from bench.load import run_load

ROOT = Path(__file__).resolve().parent.parent
SIZES = (1, 32, 128, 512)  # KB

_TOOL = {
    "type": "function",
    "function": {
        "name": "tool_{n}",
        "description": "Reads or edits files of the workspace; {n}. " * 3,
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "A path inside the workspace."},
                "options": {
                    "type": "object",
                    "properties": {
                        "recursive": {"type": "boolean"},
                        "limit": {"type": "integer", "minimum": 1, "maximum": 1000},
                        "mode": {"type": "string", "enum": ["read", "write", "append"]},
                    },
                },
            },
            "required": ["path"],
        },
    },
}


def agent_body(kb: int, model: str = "fast") -> dict[str, Any]:
    """A chat request shaped like a coding agent's turn, about `kb` KB as JSON: a system prompt,
    up to 40 tools, then tool calls and their results until the size is reached."""
    system = "You are a careful coding agent. Follow the repository's conventions. " * 20
    tools = [
        json.loads(json.dumps(_TOOL).replace("{n}", str(n))) for n in range(min(40, kb * 2 + 1))
    ]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system[: kb * 512]},
        {"role": "user", "content": "Fix the failing test in tests/test_parser.py."},
    ]
    body = {
        "model": model,
        "messages": messages,
        "tools": tools,
        "temperature": 0,
        "max_tokens": 8192,
    }
    n = 0
    while len(json.dumps(body)) < kb * 1024:
        call = f"call_{n}"
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call,
                        "type": "function",
                        "function": {"name": "tool_1", "arguments": json.dumps({"path": f"f{n}"})},
                    }
                ],
            }
        )
        line = f"    def parse_{n}(self, text: str) -> Node:  # returns the node of line {n}\n"
        messages.append({"role": "tool", "tool_call_id": call, "content": line * 24})
        n += 1
    messages.append({"role": "user", "content": "Now run the tests again."})
    return body


async def _one(peer: peers.Peer, body: dict[str, Any], requests: int) -> float:
    """CPU ms per request of `peer` over `requests` requests of `body`, one at a time."""
    before = cpu_s(peer)
    samples, _ = await run_load(
        peer.url + "/chat/completions", concurrency=1, total=requests, body=body
    )
    bad = [s for s in samples if s.status != 200]
    if bad:
        raise RuntimeError(f"{peer.name}: {len(bad)} of {len(samples)} answers not 200")
    return 1000 * (cpu_s(peer) - before) / len(samples)


async def run(rounds: int, requests: int, sizes: list[int]) -> dict[str, Any]:
    bodies = {kb: agent_body(kb) for kb in sizes}
    got: dict[str, dict[int, list[float]]] = {"floor": {}, "lanes": {}}
    with tempfile.TemporaryDirectory(prefix="lanes-agent-") as tmp:
        workdir = Path(tmp)
        async with (
            peers.fake_upstream("all", workdir) as (upstream, _),
            peers.floor(upstream, workdir) as floor,
            peers.ours(upstream, workdir, models=MODELS) as ours,
        ):
            pair = [floor, ours]
            for p in pair:  # warm-up
                await _one(p, bodies[sizes[0]], 20)
            for i in range(rounds):
                for kb, body in bodies.items():
                    for p in pair[i % 2 :] + pair[: i % 2]:
                        cpu = await _one(p, body, requests)
                        got[p.name].setdefault(kb, []).append(cpu)
                    print(
                        f"round {i + 1} {kb:>4} KB: floor {got['floor'][kb][-1]:.2f} ms, "
                        f"lanes {got['lanes'][kb][-1]:.2f} ms",
                        file=sys.stderr,
                        flush=True,
                    )
    return figures(got, sizes, {kb: len(json.dumps(b)) for kb, b in bodies.items()})


def figures(
    got: dict[str, dict[int, list[float]]], sizes: list[int], lengths: dict[int, int]
) -> dict[str, Any]:
    """Medians per size, the ratio lanes / floor and each peer's growth per KB."""
    rows = {}
    for kb in sizes:
        floor, lanes = (statistics.median(got[p][kb]) for p in ("floor", "lanes"))
        rows[kb] = {
            "bytes": lengths[kb],
            "floor_cpu_ms": floor,
            "lanes_cpu_ms": lanes,
            "ratio": lanes / floor,
        }
    small, large = sizes[0], sizes[-1]
    span_kb = (lengths[large] - lengths[small]) / 1024
    growth = {
        p: 1000 * (rows[large][f"{p}_cpu_ms"] - rows[small][f"{p}_cpu_ms"]) / span_kb
        for p in ("floor", "lanes")
    }
    return {
        "date": dt.date.today().isoformat(),
        "sizes": rows,
        "us_per_kb": growth,
        "growth_ratio": growth["lanes"] / growth["floor"] if growth["floor"] else None,
        "raw": got,
    }


def section(result: dict[str, Any] | None) -> list[str]:
    """docs/benchmarks.md's section, from a run's figures (None: none yet)."""
    if not result:
        return []
    lines = [
        "## Agent-sized requests: lanes beside the floor",
        "",
        f"`python -m bench.agent` on {result['date']}: a coding agent's turn (system prompt, tool "
        "schemas, tool calls and their results) through the chat door, JSON, one at a time, each "
        "peer in turn; CPU from /proc (10 ms ticks, so many requests a figure), medians over "
        "the rounds.",
        "",
        "| body | floor CPU ms a request | lanes | lanes / floor |",
        "|---|---|---|---|",
    ]
    for kb, row in result["sizes"].items():
        lines.append(
            f"| {int(kb):,} KB ({row['bytes']:,} B) | {row['floor_cpu_ms']:.2f} | "
            f"{row['lanes_cpu_ms']:.2f} | {row['ratio']:.2f}× |"
        )
    g = result["us_per_kb"]
    lines += [
        "",
        f"Growth per KB: floor {g['floor']:.1f} µs, lanes {g['lanes']:.1f} µs "
        f"({result['growth_ratio']:.2f}× the floor's).",
        "",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    result = trio.run(run, args.rounds, args.requests, sizes)
    out = args.out or ROOT / "bench" / "results" / f"agent-{result['date']}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    for kb, row in result["sizes"].items():
        print(
            f"{kb:>4} KB ({row['bytes']:,} B): floor {row['floor_cpu_ms']:.2f} ms, lanes "
            f"{row['lanes_cpu_ms']:.2f} ms, lanes/floor {row['ratio']:.2f}x"
        )
    g = result["us_per_kb"]
    print(
        f"per KB: floor {g['floor']:.1f} us, lanes {g['lanes']:.1f} us "
        f"({result['growth_ratio']:.2f}x); {out}"
    )


if __name__ == "__main__":
    main()

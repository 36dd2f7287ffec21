"""`python -m bench.workers_cpu [--seconds 6]`: where the CPU goes when `lanes serve --workers 2`
is loaded, JSON and SSE at 64 connections — the sidecar's processes, the fake upstream, and the load
generator (this process), in CPU seconds per wall second (2.0 = both cores of this machine).

Issue 32 asks why two workers scale JSON 2.0× but SSE 1.6×. If the three together use the whole
machine under SSE, the ceiling is the machine's, not the sidecar's: the answer is in the split, and
in the answers per CPU second the sidecar itself used (the same with two workers as with one when
nothing is lost to the second process).
Writes bench/results/workers-cpu-DATE.json. Loopback only.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from bench import peers, publish
from bench.load import body, run_load, summary

ROOT = Path(__file__).resolve().parent.parent


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _upstream_pid(url: str) -> int | None:
    """The fake upstream's pid: the process listening on its port."""
    port = int(url.rsplit(":", 1)[1].split("/", 1)[0])
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        parts = line.split()
        if int(parts[1].split(":")[1], 16) == port and parts[3] == "0A":
            inodes.add(parts[9])
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd).startswith("socket:[") and os.readlink(fd)[8:-1] in inodes:
                    return int(proc.name)
        except OSError:
            continue
    return None


async def measure(seconds: float) -> dict[str, Any]:
    out: dict[str, Any] = {"date": dt.date.today().isoformat(), "cores": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="lanes-wcpu-") as tmp:
        workdir = Path(tmp)
        async with peers.fake_upstream("all", workdir) as (upstream, _):
            upstream_pid = _upstream_pid(upstream)
            for workers in (1, 2):
                async with peers.ours(upstream, workdir, models=("fast",), workers=workers) as p:
                    assert p.process is not None
                    url = p.url + "/chat/completions"
                    await run_load(url, concurrency=8, total=100, body=body())  # warm-up
                    await run_load(url, concurrency=8, total=100, stream=True, body=body())
                    for stream in (False, True):
                        before = (
                            peers.tree_cpu_s(p.process.pid),
                            peers.tree_cpu_s(upstream_pid) if upstream_pid else 0.0,
                            _own_cpu_s(),
                            time.monotonic(),  # wall-clock: CPU per wall second is the measure
                        )
                        samples, wall = await run_load(
                            url, concurrency=64, duration_s=seconds, stream=stream, body=body()
                        )
                        after = (
                            peers.tree_cpu_s(p.process.pid),
                            peers.tree_cpu_s(upstream_pid) if upstream_pid else 0.0,
                            _own_cpu_s(),
                            time.monotonic(),  # wall-clock: as above
                        )
                        span = after[3] - before[3]
                        row = summary(samples, wall)
                        out[f"{'sse' if stream else 'json'}_w{workers}"] = {
                            "rps": row["rps"],
                            "ok": row["ok"],
                            "cpu_per_wall_s": {
                                "sidecar": (after[0] - before[0]) / span,
                                "upstream": (after[1] - before[1]) / span,
                                "load_generator": (after[2] - before[2]) / span,
                            },
                        }
    for kind in ("json", "sse"):
        out[f"{kind}_w2_over_w1"] = out[f"{kind}_w2"]["rps"] / out[f"{kind}_w1"]["rps"]
        # answers per CPU second the sidecar itself used: 1.0 when two workers do as much with a
        # core as one does (the scaling then is the cores the sidecar gets, no more)
        per_cpu = [
            out[f"{kind}_w{w}"]["rps"] / out[f"{kind}_w{w}"]["cpu_per_wall_s"]["sidecar"]
            for w in (1, 2)
        ]
        out[f"{kind}_per_sidecar_cpu_w2_over_w1"] = per_cpu[1] / per_cpu[0]
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    head = peers.commit()  # when the run starts: what it measures
    parser.add_argument("--seconds", type=float, default=6.0)
    args = parser.parse_args()
    result = trio.run(measure, args.seconds)
    for key, value in result.items():
        if isinstance(value, dict):
            cpu = value["cpu_per_wall_s"]
            print(
                f"{key}: {value['rps']:.0f} req/s · CPU/wall s: sidecar {cpu['sidecar']:.2f}, "
                f"upstream {cpu['upstream']:.2f}, load {cpu['load_generator']:.2f}, "
                f"all {sum(cpu.values()):.2f} of {result['cores']}"
            )
    print(f"w2/w1: JSON {result['json_w2_over_w1']:.2f}x, SSE {result['sse_w2_over_w1']:.2f}x")
    print(
        "w2/w1 per CPU second of the sidecar's own: "
        f"JSON {result['json_per_sidecar_cpu_w2_over_w1']:.2f}x, "
        f"SSE {result['sse_per_sidecar_cpu_w2_over_w1']:.2f}x"
    )
    path = publish.result_path(ROOT / "bench" / "results", f"workers-cpu-{result['date']}", head)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

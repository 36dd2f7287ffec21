"""`python -m lanes.harness.herd CONFIG --jobs N [--rounds R] [--model M] [--go PATH]`:
a job process that imports the dispatcher, for tests and benchmarks of several processes sharing
one state file (see `open_job_processes` in `processes.py`).

It opens a dispatcher on CONFIG, prints `ready`, and then for each round r = 1…R waits until the
file `PATH.r` exists, sends N jobs at once, and prints one JSON line: `{"round": r, "outcomes":
{"ok" | error code: count}}`. Then it closes the dispatcher (its last sync) and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter

import trio

import lanes


async def _round(
    dispatcher: lanes.Dispatcher, jobs: int, model: str, deadline_s: float
) -> Counter[str]:
    outcomes: Counter[str] = Counter()

    async def one() -> None:
        job = lanes.Job(
            messages=[{"role": "user", "content": "herd"}], model=model, deadline_s=deadline_s
        )
        try:
            await dispatcher.complete(job)
        except lanes.JobFailed as exc:
            outcomes[exc.code] += 1
            return
        outcomes["ok"] += 1

    async with trio.open_nursery() as nursery:
        for _ in range(jobs):
            nursery.start_soon(one)
    return outcomes


async def main(args: argparse.Namespace) -> None:
    async with lanes.open_dispatcher(args.config, env=os.environ) as dispatcher:
        print("ready", flush=True)
        for r in range(1, args.rounds + 1):
            go = trio.Path(f"{args.go}.{r}")
            while not await go.exists():  # noqa: ASYNC110 - another process's signal, no event
                await trio.sleep(0.002)
            outcomes = await _round(dispatcher, args.jobs, args.model, args.deadline_s)
            print(json.dumps({"round": r, "outcomes": dict(outcomes)}), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m lanes.harness.herd")
    parser.add_argument("config")
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--model", default="auto")
    parser.add_argument("--deadline-s", type=float, default=10.0)
    parser.add_argument("--go", default="go")
    trio.run(main, parser.parse_args())
    sys.exit(0)

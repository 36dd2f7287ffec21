"""The dispatcher's own cost per job, without HTTP: `python -m bench.plan [--jobs 3000]`.

One dispatcher (`open_over`) over an in-process upstream (httpx2's `MockTransport`, answering every
request at once with a fixed completion and Groq-style rate-limit headers), jobs one at a time.
Measured: CPU microseconds per job, for an alias of two models and for `auto` over catalogs of
2, 102 and 502 free models (the plan, the ranking and the gate's look at each candidate grow with
the catalog; the rest does not), and what the state sync's fold and audit write add per job.
Prints one line per case and writes `bench/results/plan-<date>.json`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx2
import trio

import lanes
from bench import peers, publish
from lanes._core.open import open_over

ROOT = Path(__file__).resolve().parent.parent
ANSWER = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "The quick brown fox."},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }
).encode()
HEADERS = {
    "content-type": "application/json",
    "x-ratelimit-limit-requests": "14400",
    "x-ratelimit-remaining-requests": "14000",
    "x-ratelimit-reset-requests": "2m59.56s",
    "x-ratelimit-limit-tokens": "6000",
    "x-ratelimit-remaining-tokens": "5000",
    "x-ratelimit-reset-tokens": "2.5s",
}
MESSAGES = [{"role": "user", "content": "Benchmark: say the pangram."}]
#: (name, the model asked, models on each of five more lanes)
CASES = (
    ("alias", "fast", 0),
    ("auto-2", "auto", 0),
    ("auto-102", "auto", 20),
    ("auto-502", "auto", 100),
)


def _answer(request: httpx2.Request) -> httpx2.Response:
    return httpx2.Response(200, headers=HEADERS, content=ANSWER)


def config(per_lane: int) -> dict[str, Any]:
    lane = {"module": "openai_compatible", "api_key_env": "", "free_tier": {"kind": "rate_limited"}}
    return {
        "state": ":memory:",
        "local_state": ":memory:",
        "default_deadline_s": 30,
        "policy": {"free_tier_fallback": "off"},
        "aliases": {"fast": ["up/fast", "up/slow"]},
        "lanes": [
            {
                **lane,
                "name": "up",
                "base_url": "http://up.invalid/v1",
                "models": [{"id": "fast"}, {"id": "slow"}],
            },
            *(
                {
                    **lane,
                    "name": f"l{i}",
                    "base_url": f"http://l{i}.invalid/v1",
                    "models": [{"id": f"m{j}"} for j in range(per_lane)],
                }
                for i in range(5)
                if per_lane
            ),
        ],
    }


async def measure(model: str, per_lane: int, jobs: int) -> dict[str, float]:
    transport = httpx2.MockTransport(_answer)
    async with open_over(
        lanes.load_config(config(per_lane), env={}), env={}, transport=transport
    ) as d:
        for _ in range(200):  # warm: what serves has outcomes of its own, as in steady traffic
            await d.complete(lanes.Job(messages=MESSAGES, model=model))
        d.take_audit_rows()
        started = time.process_time()
        for _ in range(jobs):
            await d.complete(lanes.Job(messages=MESSAGES, model=model))
        inline = time.process_time() - started
        started = time.process_time()
        d.store.records.add_audit(d.take_audit_rows())
        fold = time.process_time() - started
    return {"us_per_job": 1e6 * inline / jobs, "fold_and_write_us_per_job": 1e6 * fold / jobs}


def main() -> None:
    parser = argparse.ArgumentParser()
    head = peers.commit()  # when the run starts: what it measures
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    out: dict[str, Any] = {"date": dt.date.today().isoformat(), "jobs": args.jobs, "cases": {}}
    for name, model, per_lane in CASES:
        runs = [trio.run(measure, model, per_lane, args.jobs) for _ in range(args.repeats)]
        best = min(runs, key=lambda r: r["us_per_job"])  # the least disturbed of the repeats
        out["cases"][name] = {**best, "models": 2 + 5 * per_lane, "runs": runs}
        print(
            f"{name}: {best['us_per_job']:.0f} µs a job (best of {args.repeats}), + "
            f"{best['fold_and_write_us_per_job']:.0f} µs folded and written later",
            file=sys.stderr,
            flush=True,
        )
    path = publish.result_path(ROOT / "bench" / "results", f"plan-{out['date']}", head)
    path.write_text(json.dumps(out, indent=2))
    print(f"bench: wrote {path.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()

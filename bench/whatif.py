"""`python -m bench.whatif [--jobs 100000]`: how fast `lanes whatif` replays a busy day.

A synthetic audit of one UTC day (Poisson arrivals with bursts; a fifth streamed, a twentieth
embeddings; three free lanes, a local one and a paid one) is written to a temporary SQLite file by
the audit's own writer; then one config is replayed over it in this process (one core), and the
oracle's bound computed. Prints, and writes bench/results/whatif-DATE.json: jobs, wall seconds,
milliseconds per job, the figures. Nothing leaves 127.0.0.1 — nothing connects at all.
"""

from __future__ import annotations

import argparse
import calendar
import datetime as dt
import json
import random
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

import lanes
from bench import peers, publish
from lanes._core.state import audit_tables
from lanes._whatif import oracle_of
from lanes._whatif.figures import summarise
from lanes._whatif.recorded import read_window
from lanes._whatif.replay import replay

ROOT = Path(__file__).resolve().parent.parent
DAY = 86400.0


def config(ceiling: float = 2.0) -> lanes.Config:
    def free(name: str, rpm: int, rpd: int) -> dict[str, Any]:
        return {
            "name": name,
            "module": "openai_compatible",
            "base_url": f"http://{name}.example/v1",
            "api_key_env": "",
            "free_tier": {"kind": "rate_limited", "rpm": rpm, "rpd": rpd},
            "models": [{"id": "m", "context": 131072}, {"id": "embed", "embedding": True}],
        }

    return lanes.load_config(
        {
            "lanes": [
                free("groq", 30, 14400),
                free("cerebras", 30, 10000),
                free("gemini", 10, 1500),
                {
                    "name": "paid",
                    "module": "openai_compatible",
                    "base_url": "http://paid.example/v1",
                    "api_key_env": "",
                    "free_tier": {"kind": "none"},
                    "models": [
                        {"id": "m", "input_usd_per_mtok": 0.15, "output_usd_per_mtok": 0.6},
                        {"id": "embed", "embedding": True, "input_usd_per_mtok": 0.02},
                    ],
                },
            ],
            "aliases": {
                "chat": ["groq/m", "cerebras/m", "gemini/m", "paid/m"],
                "embed": ["groq/embed", "cerebras/embed", "paid/embed"],
            },
            "policy": {"free_tier_fallback": "allow", "paid_ceiling_usd_per_day": ceiling},
            "scoring": {"explore_rate": 0.0},
        },
        env={},
    )


def synthetic_audit(path: Path, jobs: int, midnight: float, seed: int = 3) -> None:
    """`jobs` audit rows over the day after `midnight`, as a sidecar would have written them."""
    rng = random.Random(seed)
    times = sorted(rng.uniform(0, DAY) for _ in range(int(jobs * 0.9)))
    for _ in range(10):  # ten bursts of 1 % each, in 2 minutes
        start = rng.uniform(0, DAY - 120)
        times += [start + rng.uniform(0, 120) for _ in range(jobs // 100)]
    times = sorted(times)[:jobs]
    conn = sqlite3.connect(path)
    conn.executescript(audit_tables.SCHEMA)
    rows = []
    for n, t in enumerate(times):
        embedding = n % 20 == 0
        latency = rng.uniform(0.2, 1.5)
        rows.append(
            {
                "job": f"job-{n}",
                "at": midnight + t + latency,
                "client": "anonymous",
                "cohort": "",
                "class": "general",
                "route": "primary",
                "outcome": "ok",
                "lane": "groq",
                "model": "embed" if embedding else "m",
                "tier": "free",
                "privacy": "any",
                "attempts": 1,
                "latency_s": latency,
                "tokens": 700,
                "cost_usd": 0.0,
                "asked": "embed" if embedding else "chat",
                "embedding": int(embedding),
                "streamed": int(n % 5 == 0 and not embedding),
                "max_tokens": None if embedding else 512,
                "deadline_s": 30.0,
                "prompt_tokens": 500,
                "completion_tokens": 0 if embedding else 200,
                "attempt_rows": [],
            }
        )
        if len(rows) == 5000:
            audit_tables.write(conn, rows)
            rows = []
    audit_tables.write(conn, rows)
    conn.close()


def measure(jobs: int = 100_000) -> dict[str, Any]:
    """Write a synthetic day of `jobs` into a temporary audit, replay it under `config()` here (one
    core), compute the oracle's bound; the figures and how long each took."""
    midnight = float(calendar.timegm((dt.date.today() - dt.timedelta(days=1)).timetuple()))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "audit.db"
        synthetic_audit(path, jobs, midnight)
        window = read_window(path, midnight, midnight + DAY)
        started = time.perf_counter()  # wall-clock: the replay's own duration is the measure
        run = replay(config(), window.jobs, since=midnight)
        replayed_s = time.perf_counter() - started  # wall-clock: as above
        started = time.perf_counter()  # wall-clock: the oracle's duration
        best = oracle_of(run, window.jobs)
        oracle_s = time.perf_counter() - started  # wall-clock: as above
    figures = summarise("bench", run.rows, ceiling_usd=2.0, oracle_free=best)
    return {
        "date": dt.date.today().isoformat(),
        "jobs": len(window.jobs),
        "replay_wall_s": round(replayed_s, 2),
        "ms_per_job": round(1000 * replayed_s / max(1, len(window.jobs)), 3),
        "oracle_wall_s": round(oracle_s, 2),
        "upstream_requests": run.upstream_requests,
        "free_share": figures.free_share,
        "oracle_share": figures.oracle_share,
        "paid_jobs": figures.paid_jobs,
        "paid_usd": figures.paid_usd,
        "failed": dict(figures.failed),
        "by_lane": dict(figures.by_lane),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    head = peers.commit()  # when the run starts: what it measures
    result = measure(args.jobs)
    print(json.dumps(result, indent=2))
    if not args.no_write:
        out = publish.result_path(ROOT / "bench" / "results", f"whatif-{result['date']}", head)
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

"""How long `lanes report` takes over a large audit: a million jobs (and their attempts) written
into a fresh SQLite state file the way the sidecar writes them, then the report by cohort and by
model, timed (median of repetitions). Run alone: `python -m bench.audit_report [--rows N]`."""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lanes._core.audit.report import report
from lanes._core.state.store import SQLiteStore

COHORTS = ("ads", "organic", "partner", "newsletter")
ROUTES = (
    ("primary", "free", "ok"),
    ("free_retry", "free", "ok"),
    ("paid_fallback", "paid", "ok"),
    ("local", "local", "ok"),
    ("", "", "free_tier_exhausted"),
)


def fill(store: SQLiteStore, rows: int, *, now: float, seed: int = 7) -> None:
    """`rows` jobs over the last week, one to three attempts each, written the way the sidecar
    writes them (`add_audit`: the rows, their attempts and the hourly roll-ups), in batches."""
    rng = random.Random(seed)
    batch: list[dict[str, Any]] = []
    for i in range(rows):
        route, tier, outcome = ROUTES[rng.randrange(len(ROUTES))]
        at = now - rng.uniform(0, 7 * 86400)
        n = 1 if route in ("primary", "local") else 2 if route == "free_retry" else 3
        cost = rng.uniform(1e-5, 1e-3) if route == "paid_fallback" else 0.0
        common = {
            "at": at,
            "client": f"c{i % 50}",
            "cohort": COHORTS[i % len(COHORTS)],
            "class": "general",
        }
        batch.append(
            {
                **common,
                "job": f"j{i}",
                "route": route,
                "outcome": outcome,
                "lane": f"lane{i % 7}",
                "model": f"model{i % 13}",
                "tier": tier,
                "privacy": "any",
                "zdr": 0,
                "attempts": n,
                "free_attempts": 1 if route == "primary" else 2,
                "first_free_outcome": "ok" if route == "primary" else "rate_limited",
                "cost_usd": cost,
                "latency_s": 0.4,
                "attempt_rows": [
                    {
                        **common,
                        "job": f"j{i}",
                        "n": k,
                        "lane": f"lane{(i + k) % 7}",
                        "model": "m",
                        "tier": tier,
                        "route": route or "primary",
                        "outcome": "ok" if k == n - 1 else "rate_limited",
                        "category": "" if k == n - 1 else "rate_limited",
                        "status": 200,
                        "retry": 0,
                        "latency_s": 0.1,
                        "tokens": 10,
                        "cost_usd": cost if k == n - 1 else 0.0,
                    }
                    for k in range(n)
                ],
            }
        )
        if len(batch) >= 10_000 or i == rows - 1:
            store.records.add_audit(batch)
            batch = []


def measure(rows: int = 1_000_000, repeats: int = 3) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="lanes-audit-") as tmp:
        store = SQLiteStore(str(Path(tmp) / "state.db"))
        now = time.time()  # wall-clock: the audit's times are epoch seconds
        started = time.perf_counter()
        fill(store, rows, now=now)
        fill_s = time.perf_counter() - started
        timings: dict[str, list[float]] = {"cohort": [], "model": []}
        for _ in range(repeats):
            for by in timings:
                started = time.perf_counter()
                result = report(store.records.query, since=now - 7 * 86400, by=by, ceiling_usd=1.0)
                timings[by].append(time.perf_counter() - started)
        (attempt_rows,) = store.records.query("SELECT COUNT(*) FROM audit_attempt")[0]
        store.close()
    assert result.total.jobs == rows
    return {
        "jobs": rows,
        "attempts": attempt_rows,
        "fill_s": round(fill_s, 2),
        **{f"report_by_{by}_s": round(statistics.median(t), 3) for by, t in timings.items()},
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()
    print(json.dumps(measure(args.rows), indent=2))
    sys.exit(0)

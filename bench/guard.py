"""The tiny-request guard (issue 45): lanes' throughput over the floor's at c=64 in a
`bench.hot --floor` run, never below 0.7× — read from a run, and from the last published one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


#: The tiny-request guard (issue 45): lanes' throughput over the floor's at c=64, never below 0.7×.
GUARD = (("JSON", "json_c64"), ("SSE", "sse_c64"))
GUARD_FLOOR = 0.7


def guard(h: dict[str, Any] | None) -> dict[str, float]:
    """lanes / floor throughput at c=64 in a `--floor` run, averaged over its rounds ({} when the
    run had no floor)."""
    rounds = [r for r in (h or {}).get("rounds", []) if "floor" in r]
    return {
        name: sum(r["lanes"][m]["rps"] / r["floor"][m]["rps"] for r in rounds) / len(rounds)
        for name, m in GUARD
        if rounds and all(m in r["lanes"] and m in r["floor"] for r in rounds)
    }


def guard_line(new: dict[str, Any], published: dict[str, Any] | None) -> str:
    """The guard's figures of `new` beside the last published run's."""
    now, then = guard(new), guard(published)
    shown = ", ".join(
        f"{name} {value:.2f}×"
        + (
            f" (published {then[name]:.2f}×, {published['date']})"
            if published and name in then
            else ""
        )
        + ("" if value >= GUARD_FLOOR else f" BELOW {GUARD_FLOOR}×")
        for name, value in now.items()
    )
    return f"tiny-request guard, lanes / floor throughput at c=64 (≥ {GUARD_FLOOR}×): {shown}"


def published_hot(before: str | None = None) -> dict[str, Any] | None:
    """The newest published `--floor` run in bench/results (dated before `before`, when given):
    `hot-<date>[-<commit>].json`, not a `-draft`."""
    runs = (ROOT / "bench" / "results").glob("hot-2*.json")
    for path in sorted(runs, key=lambda p: p.stem, reverse=True):  # a day's later runs first
        if "-draft" in path.name:
            continue
        data = json.loads(path.read_text())
        if guard(data) and (before is None or data["date"] < before):
            return dict(data)
    return None

"""The canary's report: a table for people, JSON for scripts, Markdown for the nightly log."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence

from lanes.canary.score import ModelReport, summary


def _when(at: float | None) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%d %H:%M UTC") if at else ""


def _first_change(r: ModelReport) -> str:
    d = next((d for d in r.diffs if not d.exact), None)
    return f"{d.prompt}: {d.excerpt_then!r} → {d.excerpt_now!r}" if d else ""


def table(reports: Sequence[ModelReport]) -> str:
    if not reports:
        return "no canary run yet: lanes canary run"
    lines = [f"{'model':<36} {'verdict':<8} {'drift':>5}  why / first change"]
    for r in reports:
        lines.append(f"{r.key:<36} {r.verdict:<8} {r.drift:>5.2f}  {r.reason}")
        if change := _first_change(r):
            lines.append(f"{'':<51}since {_when(r.changed_at)}: {change}")
    return "\n".join(lines)


def as_json(reports: Sequence[ModelReport]) -> str:
    return json.dumps(
        {
            "models": summary(reports),
            "first_changes": {r.key: _first_change(r) for r in reports if _first_change(r)},
        },
        indent=2,
    )


def markdown(reports: Sequence[ModelReport]) -> str:
    rows = ["| model | verdict | drift | why | first change |", "|---|---|---|---|---|"]
    for r in reports:
        rows.append(
            f"| `{r.key}` | {r.verdict} | {r.drift:.2f} | {r.reason} "
            f"| {_first_change(r).replace('|', '/')} |"
        )
    return "# Canary report\n\n" + "\n".join(rows) + "\n"


def exit_code(reports: Sequence[ModelReport]) -> int:
    """0 when nothing drifted or failed, 1 when something did."""
    return 1 if any(r.verdict in ("drifted", "failed") for r in reports) else 0

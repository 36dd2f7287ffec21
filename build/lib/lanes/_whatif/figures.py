"""A replay's figures (and the recorded ones, by the same rules), and how they are printed: a table
on a terminal, Markdown, JSON. No prompt reaches here: only counts, lanes, routes and money."""

from __future__ import annotations

# lanes: pure
import datetime as dt
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from lanes._core.audit.forecast import usd

FREE_TIERS = ("local", "free")


@attrs.frozen(kw_only=True)
class DaySpend:
    """One UTC day's paid spend against the ceiling, and when the ceiling was reached (ISO time,
    UTC) — `None` when it was not."""

    day: str
    spent_usd: float
    ceiling_usd: float
    reached_at: str | None


@attrs.frozen(kw_only=True)
class Figures:
    """What one config did (or the audit recorded) with the window's jobs."""

    label: str
    jobs: int
    answered: int
    free: int  # answered from local or free capacity
    free_share: float | None  # free / jobs (of all jobs, failed ones included)
    paid_jobs: int
    paid_usd: float
    failed: Mapping[str, int]  # outcome code → jobs
    approvals_asked: int  # jobs that asked for approval (answered "once", or never answered)
    by_lane: Mapping[str, int]  # lane → jobs it answered
    by_route: Mapping[str, int]  # route state (local, primary, free_retry, paid_fallback, byok)
    days: tuple[DaySpend, ...]
    oracle_free: int | None = None  # the most jobs any router could serve free (None: recorded)
    oracle_share: float | None = None


def summarise(
    label: str,
    rows: Iterable[Mapping[str, Any]],
    *,
    ceiling_usd: float,
    oracle_free: int | None = None,
) -> Figures:
    """`rows` are audit rows (replayed, or read back from the audit) with `at`, `outcome`,
    `route`, `lane`, `tier`, `cost_usd` and `approval`."""
    ordered = sorted(rows, key=lambda r: float(r.get("at") or 0.0))
    jobs = len(ordered)
    ok = [r for r in ordered if r.get("outcome") == "ok"]
    free = sum(1 for r in ok if r.get("tier") in FREE_TIERS)
    paid = [r for r in ok if r.get("route") == "paid_fallback"]
    failed = Counter(str(r.get("outcome")) for r in ordered if r.get("outcome") != "ok")
    asked = sum(
        1 for r in ordered if r.get("outcome") == "approval_required" or r.get("approval") == "once"
    )
    return Figures(
        label=label,
        jobs=jobs,
        answered=len(ok),
        free=free,
        free_share=free / jobs if jobs else None,
        paid_jobs=len(paid),
        paid_usd=round(sum(float(r.get("cost_usd") or 0.0) for r in ordered), 9),
        failed=dict(failed.most_common()),
        approvals_asked=asked,
        by_lane=dict(Counter(str(r.get("lane")) for r in ok).most_common()),
        by_route=dict(Counter(str(r.get("route")) for r in ok).most_common()),
        days=_days(ordered, ceiling_usd),
        oracle_free=oracle_free,
        oracle_share=None if oracle_free is None or not jobs else oracle_free / jobs,
    )


def _days(ordered: Sequence[Mapping[str, Any]], ceiling_usd: float) -> tuple[DaySpend, ...]:
    spent: dict[str, float] = {}
    reached: dict[str, str | None] = {}
    for row in ordered:
        at = float(row.get("at") or 0.0)
        day = _day(at)
        spent[day] = spent.get(day, 0.0) + float(row.get("cost_usd") or 0.0)
        reached.setdefault(day, None)
        if reached[day] is None and (
            row.get("outcome") == "paid_budget_exhausted"
            or (ceiling_usd > 0 and spent[day] >= ceiling_usd * (1 - 1e-9))
        ):
            reached[day] = _time(at)
    return tuple(
        DaySpend(
            day=day,
            spent_usd=round(spent[day], 9),
            ceiling_usd=ceiling_usd,
            reached_at=reached[day],
        )
        for day in sorted(spent)
    )


def _day(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%d")


def _time(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%d %H:%M")


def _share(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f} %"


def _signed(value: float) -> str:
    return ("-" if value < 0 else "+") + usd(abs(value))


def table(columns: Sequence[Figures], *, deltas: bool = True) -> list[list[str]]:
    """The figures side by side, one column each (and the last against the one before it)."""
    head = ["", *(f.label for f in columns)]
    pair = deltas and len(columns) >= 2
    if pair:
        head.append(f"Δ ({columns[-1].label} − {columns[-2].label})")
    rows = [head]

    def line(name: str, values: list[str], delta: str = "") -> None:
        rows.append([name, *values, *([delta] if pair else [])])

    a, b = (columns[-2], columns[-1]) if pair else (None, None)
    line(
        "free share (of all jobs)",
        [f"{_share(f.free_share)} ({f.free:,})" for f in columns],
        _points(a.free_share, b.free_share) if a and b else "",
    )
    line(
        "  oracle's bound",
        ["—" if f.oracle_share is None else _share(f.oracle_share) for f in columns],
    )
    line(
        "paid jobs, spend",
        [f"{f.paid_jobs:,}, {usd(f.paid_usd)}" for f in columns],
        f"{b.paid_jobs - a.paid_jobs:+,}, {_signed(b.paid_usd - a.paid_usd)}" if a and b else "",
    )
    line(
        "failed jobs",
        [f"{sum(f.failed.values()):,}" for f in columns],
        f"{sum(b.failed.values()) - sum(a.failed.values()):+,}" if a and b else "",
    )
    for code in sorted({c for f in columns for c in f.failed}):
        line(f"  {code}", [f"{f.failed.get(code, 0):,}" for f in columns])
    line("approvals asked", [f"{f.approvals_asked:,}" for f in columns])
    for lane in sorted({lane for f in columns for lane in f.by_lane}):
        line(f"served by {lane}", [f"{f.by_lane.get(lane, 0):,}" for f in columns])
    for route in sorted({r for f in columns for r in f.by_route}):
        line(f"route {route}", [f"{f.by_route.get(route, 0):,}" for f in columns])
    for day in sorted({d.day for f in columns for d in f.days}):
        cells = []
        for f in columns:
            found = next((d for d in f.days if d.day == day), None)
            if found is None:
                cells.append("—")
            else:
                when = f", ceiling at {found.reached_at[11:]}" if found.reached_at else ""
                cells.append(f"{usd(found.spent_usd)} of {usd(found.ceiling_usd)}{when}")
        line(f"paid {day}", cells)
    return rows


def _points(a: float | None, b: float | None) -> str:
    return "" if a is None or b is None else f"{100 * (b - a):+.1f} pts"


def _printable(cell: str) -> str:
    """`cell` without control characters (a lane name read from a hand-edited audit may hold a
    newline or a terminal escape): each becomes `?`."""
    return "".join(c if c.isprintable() else "?" for c in cell)


def text(rows: list[list[str]]) -> str:
    rows = [[_printable(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    )


def markdown(rows: list[list[str]]) -> str:
    cells = [[_printable(c).replace("\\", "\\\\").replace("|", "\\|") for c in r] for r in rows]
    out = ["| " + " | ".join(cells[0]) + " |", "|" + "---|" * len(cells[0])]
    out += ["| " + " | ".join(row) + " |" for row in cells[1:]]
    return "\n".join(out)


def as_json(value: Any) -> str:
    return json.dumps(attrs.asdict(value), indent=2, sort_keys=False)

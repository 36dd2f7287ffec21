"""What the audit recorded in a window, as the replay needs it: each job's arrival and shape (never
its body — the audit holds none unless `log_bodies`, and the replay never reads that column), how
it was served, and the failures each lane answered (for `--faults`), as outages observed: each from
its first failure (from the window's start when the lane had not answered before it in the window)
to the lane's next answer (to the window's end when none came) — a lane that refused every
connection of the window is down for the whole of it. A 429 holds its model only, for `FAULT_S`
from the last one or until that model answers, whichever is sooner (no reset is recorded)."""

from __future__ import annotations

import math
import os
import sqlite3
from collections.abc import Iterable, Mapping
from pathlib import Path

import attrs

from lanes._whatif.providers import FAULT_S, Fault

#: At most this many jobs are replayed from one window (about a week of a busy sidecar): what a
#: replay holds in memory is bounded where the audit enters.
MAX_JOBS = 2_000_000


@attrs.frozen(kw_only=True)
class Recorded:
    """One job as the audit recorded it."""

    arrived: float  # epoch seconds: when it ended, less its latency
    asked: str  # the model or alias it named ("auto" when an older row did not say)
    client: str
    cohort: str
    request_class: str
    privacy: str
    embedding: bool
    streamed: bool
    prompt_tokens: int
    completion_tokens: int
    max_tokens: int | None
    deadline_s: float | None
    latency_s: float
    # how it went
    outcome: str
    route: str
    lane: str
    model: str
    tier: str
    cost_usd: float
    approval: str


@attrs.frozen(kw_only=True)
class RecordedWindow:
    """The recorded jobs of a window (by arrival), the faults, and what was left out."""

    since: float
    until: float
    jobs: tuple[Recorded, ...]
    faults: tuple[Fault, ...]  # the outages observed, for `--faults`
    failures: Mapping[str, Mapping[str, int]]  # lane → failure kind → failed attempts
    older_rows: int  # rows written before the audit kept what a replay needs (their shape guessed)
    left_out: int  # rows past MAX_JOBS, not replayed


_COLUMNS = (
    "at, latency_s, asked, client, cohort, class, privacy, embedding, streamed, prompt_tokens, "
    "completion_tokens, tokens, request_bytes, max_tokens, deadline_s, outcome, route, lane, "
    "model, tier, cost_usd, approval"
)


def read_window(path: str | os.PathLike[str], since: float, until: float) -> RecordedWindow:
    """The audit in the SQLite file at `path` between `since` and `until` (epoch seconds),
    read-only. Raises FileNotFoundError or sqlite3.Error for a file that is not an audit."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"{file}: no audit here (no such file)")
    conn = sqlite3.connect(file.resolve().as_uri() + "?mode=ro", uri=True)  # escaped: ?, #, %
    try:
        have = {row[1] for row in conn.execute('PRAGMA table_info("audit")')}
        if not have:
            raise sqlite3.DatabaseError(f"{file}: holds no audit table")
        wanted = [c.strip() for c in _COLUMNS.split(",")]
        select = ", ".join(c if c in have else "NULL" for c in wanted)
        rows = conn.execute(
            f"SELECT {select} FROM audit WHERE at >= ? AND at < ? ORDER BY at LIMIT ?",
            (since, until + 3600.0, MAX_JOBS + 1),
        ).fetchall()
        faults, failures = _outages(_attempts(conn, since, until), since, until)
    finally:
        conn.close()
    jobs, older = [], 0
    for row in rows[:MAX_JOBS]:
        job, old = _recorded(dict(zip(wanted, row, strict=True)))
        if since <= job.arrived < until:
            jobs.append(job)
            older += old
    jobs.sort(key=lambda j: j.arrived)
    return RecordedWindow(
        since=since,
        until=until,
        jobs=tuple(jobs),
        faults=tuple(faults),
        failures=failures,
        older_rows=older,
        left_out=max(0, len(rows) - MAX_JOBS),
    )


def _recorded(row: dict[str, object]) -> tuple[Recorded, bool]:
    def num(name: str, default: float = 0.0) -> float:
        value = row.get(name)  # a hand-edited file may hold text, or 9e999 (SQLite's infinity)
        if isinstance(value, int | float) and math.isfinite(value):
            return float(value)
        return default

    older = row.get("asked") is None
    tokens = int(num("tokens"))
    prompt = row.get("prompt_tokens")
    completion = row.get("completion_tokens")
    if isinstance(prompt, int) and isinstance(completion, int):
        prompt_tokens, completion_tokens = prompt, completion
    else:  # an older row, or no sane usage: the request's size says the prompt
        prompt_tokens = int(num("request_bytes") // 4) + 1
        completion_tokens = max(0, tokens - prompt_tokens) if tokens else 16
    latency = max(0.0, num("latency_s"))
    max_tokens = row.get("max_tokens")
    deadline = num("deadline_s")
    return (
        Recorded(
            arrived=num("at") - latency,
            asked=str(row.get("asked") or "auto"),
            client=str(row.get("client") or "anonymous"),
            cohort=str(row.get("cohort") or ""),
            request_class=str(row.get("class") or "general"),
            privacy=str(row.get("privacy") or "any"),
            embedding=num("embedding") != 0,  # text ("no", "false") is no flag: a chat
            streamed=num("streamed") != 0,
            prompt_tokens=max(0, prompt_tokens),
            completion_tokens=max(0, completion_tokens),
            max_tokens=max_tokens if isinstance(max_tokens, int) and max_tokens > 0 else None,
            deadline_s=deadline if deadline > 0 else None,
            latency_s=latency,
            outcome=str(row.get("outcome") or ""),
            route=str(row.get("route") or ""),
            lane=str(row.get("lane") or ""),
            model=str(row.get("model") or ""),
            tier=str(row.get("tier") or ""),
            cost_usd=num("cost_usd"),
            approval=str(row.get("approval") or ""),
        ),
        older,
    )


_FAULT_KINDS = {"connect": "connect", "reset": "reset", "transport": "connect"}


def _attempts(
    conn: sqlite3.Connection, since: float, until: float
) -> Iterable[tuple[float, str, str, str]]:
    """Each attempt of the window that was answered or failed upstream, in time order, as (at,
    lane, model, kind): `ok`, or the kind of failure a replay answers again."""
    have = {row[1] for row in conn.execute('PRAGMA table_info("audit_attempt")')}
    if not have:
        return
    for at, lane, model, outcome, category in conn.execute(
        "SELECT at, lane, model, outcome, category FROM audit_attempt "
        "WHERE at >= ? AND at < ? AND outcome IN ('ok', 'fault', 'rate_limited', "
        "'credit_exhausted') ORDER BY at, job, n LIMIT ?",
        (since, until, 4 * MAX_JOBS),
    ):
        if not isinstance(at, int | float) or not math.isfinite(at):
            continue
        kind = _FAULT_KINDS.get(str(category), "server_error") if outcome == "fault" else outcome
        yield float(at), str(lane), str(model), str(kind)


def _outages(
    attempts: Iterable[tuple[float, str, str, str]], since: float, until: float
) -> tuple[list[Fault], dict[str, dict[str, int]]]:
    """The outages the attempts show (see the module docstring), and the failed attempts counted
    by lane and kind. One pass; what it holds is the outages, not the attempts."""
    found: list[Fault] = []
    failures: dict[str, dict[str, int]] = {}
    answered: set[str] = set()  # lanes that answered at least once so far
    open_: dict[tuple[str, str], Fault] = {}  # (lane, model or "") → the outage under way

    def close(key: tuple[str, str], at: float) -> None:
        fault = open_.pop(key, None)
        if fault is not None and min(fault.until, at) > fault.at:
            found.append(attrs.evolve(fault, until=min(fault.until, at)))

    for at, lane, model, kind in attempts:
        if kind == "ok":
            answered.add(lane)
            close((lane, ""), at)
            close((lane, model), at)
            continue
        counts = failures.setdefault(lane, {})
        counts[kind] = counts.get(kind, 0) + 1
        if kind == "rate_limited":  # its model, FAULT_S from the last 429
            close((lane, model), at)
            open_[(lane, model)] = Fault(
                at=at, until=at + FAULT_S, lane=lane, model=model, kind=kind
            )
            continue
        under_way = open_.get((lane, ""))
        if under_way is not None and under_way.kind == kind:
            continue
        close((lane, ""), at)
        start = at if lane in answered or under_way is not None else since
        open_[(lane, "")] = Fault(at=start, until=until, lane=lane, model=model, kind=kind)
    for key in list(open_):
        close(key, until)
    found.sort(key=lambda f: f.at)
    return found, failures

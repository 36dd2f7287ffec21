"""What the audit says, per acquisition cohort (or class, lane, model, client): the measures
seed 004 asks for before any limit is raised, and the story of one request. Pure: it builds SQL
and reads the rows through a `query` function (a store's), so the same numbers reach `lanes report`,
`GET /v1/report`, `lanes explain` and `GET /v1/requests/{id}`.

Per group: jobs, answers and jobs abandoned (their client went away first); the free share (answers
served by owned or borrowed-free capacity); the primary-free success rate; the free-retry rate and
why the primary failed; paid-fallback frequency and its actual cost (what the ledger settled — the
groups' costs add up to the ledger); attempts per answer; latency per route state; provider error
categories; and the privacy of the endpoint actually selected against what the job needed. Over time
— per UTC hour (the page's charts) and per UTC day — jobs, answers, the free and paid shares of the
answers, attempts per answer and paid spend (per day against the ceiling).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from typing import Any

import attrs

from lanes._core.state.audit import ATTEMPT_COLUMNS, DIMENSIONS, client_dim

# lanes: pure

Query = Callable[[str, tuple[Any, ...]], list[tuple[Any, ...]]]
GROUPS = DIMENSIONS  # what the audit is rolled up by
DAY_S = 86400.0


@attrs.frozen(kw_only=True)
class ReportGroup:
    key: str
    jobs: int
    answered: int
    abandoned: int  # jobs whose client went away before their answer (the job was cancelled)
    free_share: float | None  # answers served by local or borrowed-free capacity / answers
    primary_free_success: float | None  # jobs whose first free attempt answered / jobs with one
    free_retry_rate: float | None  # jobs that needed a free retry / jobs with a free attempt
    free_retry_reasons: dict[str, int]  # why their primary failed
    paid_jobs: int  # answered by the paid fallback
    paid_cost_usd: float  # what the ledger settled for the group's paid attempts
    attempts_per_answer: float | None
    requests: int  # upstream attempts (requests sent)
    latency_s_by_route: dict[str, float]  # mean attempt latency per route state
    errors: dict[str, int]  # failed attempts by category
    privacy: dict[str, int]  # "need → selected endpoint" (local, zdr, retains, none) → jobs
    # answered by the response cache, the tokens those answers counted (the quota they saved)
    # and what they cost when they were made
    cache_hits: int = 0
    cache_saved_tokens: int = 0
    cache_saved_usd: float = 0.0


@attrs.frozen(kw_only=True)
class Hour:
    hour: float  # epoch seconds (UTC) at which the hour starts
    jobs: int
    answered: int
    free_share: float | None  # answers served by local or borrowed-free capacity / answers
    paid_share: float | None  # answers served by the paid fallback / answers
    paid_cost_usd: float
    attempts_per_answer: float | None


@attrs.frozen(kw_only=True)
class Day:
    day: str  # YYYY-MM-DD (UTC)
    jobs: int
    answered: int
    free_share: float | None
    paid_share: float | None
    paid_cost_usd: float
    attempts_per_answer: float | None
    ceiling_usd: float


@attrs.frozen(kw_only=True)
class Report:
    since: float  # epoch seconds
    by: str
    total: ReportGroup
    groups: tuple[ReportGroup, ...]
    days: tuple[Day, ...]
    hours: tuple[Hour, ...]  # the hours (and days) without a job are left out

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def _share(part: int | None, whole: int | None) -> float | None:
    return (part or 0) / whole if whole else None


def report(
    query: Query, *, since: float, by: str, ceiling_usd: float, client: str | None = None
) -> Report:
    """The measures since `since` (epoch seconds, taken by whole hours: the audit is rolled up per
    hour), grouped by `by` (one of `GROUPS`). With `client`, of that client's jobs only (its own
    roll-ups: jobs audited before they were kept are not in them)."""
    if by not in GROUPS:
        raise ValueError(f"by must be one of {', '.join(GROUPS)} (got {str(by)[:40]!r})")
    hour = int(since // 3600)

    def dim(name: str) -> str:
        return name if client is None else client_dim(name, client)

    groups = _groups(query, hour=hour, dim=dim(by))
    total = _groups(query, hour=hour, dim=dim("all"))
    empty = _group("all", (0,) * 13, {}, {}, {}, {}, 0)
    hours = _hours(query, hour, dim("all"))
    return Report(
        since=hour * 3600.0,
        by=by,
        total=total.get("all", empty),
        groups=tuple(groups[k] for k in sorted(groups)),
        days=_days(hours, ceiling_usd),
        hours=tuple(_hour(h, sums) for h, sums in hours.items()),
    )


def _groups(query: Query, *, hour: int, dim: str) -> dict[str, ReportGroup]:
    jobs = query(
        "SELECT value, SUM(jobs), SUM(CASE WHEN outcome = 'ok' THEN jobs END), "
        "SUM(CASE WHEN outcome = 'abandoned' THEN jobs END), "
        "SUM(CASE WHEN outcome = 'ok' AND tier IN ('local', 'free') THEN jobs END), "
        "SUM(CASE WHEN first_free_outcome != '' THEN jobs END), "
        "SUM(CASE WHEN first_free_outcome = 'ok' THEN jobs END), "
        "SUM(CASE WHEN retried = 1 THEN jobs END), "
        "SUM(CASE WHEN outcome = 'ok' AND route = 'paid_fallback' THEN jobs END), "
        "COALESCE(SUM(cost_usd), 0), "
        "1.0 * SUM(CASE WHEN outcome = 'ok' THEN attempts END) "
        "/ SUM(CASE WHEN outcome = 'ok' THEN jobs END), "
        "SUM(CASE WHEN route = 'cache' THEN jobs END), COALESCE(SUM(saved_tokens), 0), "
        "COALESCE(SUM(saved_usd), 0) "
        "FROM audit_jobs_hourly WHERE dim = ? AND hour >= ? GROUP BY 1",
        (dim, hour),
    )

    def per_group(what: str, table: str, only: str = "") -> dict[Any, dict[Any, Any]]:
        """`what` (a key and its sum) per group value: from `table`'s rows of `dim` since `hour`
        (`only`: and these)."""
        return _nested(
            query(
                f"SELECT value, {what} FROM {table} "
                f"WHERE dim = ? AND hour >= ? {only} GROUP BY 1, 2",
                (dim, hour),
            )
        )

    reasons = per_group("first_free_outcome, SUM(jobs)", "audit_jobs_hourly", "AND retried = 1")
    privacy = per_group(
        "CASE WHEN privacy = '' THEN 'any' ELSE privacy END || ' → ' || CASE "
        "WHEN outcome != 'ok' THEN 'none' WHEN tier = 'local' THEN 'local' "
        "WHEN zdr = 1 THEN 'zdr' ELSE 'retains' END, SUM(jobs)",
        "audit_jobs_hourly",
    )
    latency = per_group("route, SUM(latency_s) / SUM(attempts)", "audit_attempts_hourly")
    errors = per_group(
        "CASE WHEN category != '' THEN category ELSE outcome END, SUM(attempts)",
        "audit_attempts_hourly",
        "AND outcome != 'ok'",
    )
    requests: dict[Any, int] = dict(
        query(
            "SELECT value, SUM(attempts) FROM audit_attempts_hourly "
            "WHERE dim = ? AND hour >= ? GROUP BY 1",
            (dim, hour),
        )
    )
    return {
        str(row[0]): _group(
            str(row[0]),
            row[1:],
            reasons.get(row[0], {}),
            latency.get(row[0], {}),
            errors.get(row[0], {}),
            privacy.get(row[0], {}),
            requests.get(row[0], 0),
        )
        for row in jobs
    }


def _group(
    key: str,
    row: tuple[Any, ...],
    reasons: dict[str, Any],
    latency: dict[str, Any],
    errors: dict[str, Any],
    privacy: dict[str, Any],
    requests: int,
) -> ReportGroup:
    jobs, answered, abandoned, free_answers, with_free, free_ok, retried, paid, cost = row[:9]
    per_answer, hits, saved_tokens, saved_usd = row[9:]
    return ReportGroup(
        key=key,
        jobs=jobs or 0,
        answered=answered or 0,
        abandoned=abandoned or 0,
        free_share=_share(free_answers, answered),
        primary_free_success=_share(free_ok, with_free),
        free_retry_rate=_share(retried, with_free),
        free_retry_reasons={str(k): int(v) for k, v in reasons.items()},
        paid_jobs=paid or 0,
        paid_cost_usd=float(cost or 0.0),
        attempts_per_answer=float(per_answer) if per_answer is not None else None,
        requests=int(requests or 0),
        latency_s_by_route={str(k): float(v) for k, v in latency.items()},
        errors={str(k): int(v) for k, v in errors.items()},
        privacy={str(k): int(v) for k, v in privacy.items()},
        cache_hits=int(hits or 0),
        cache_saved_tokens=int(saved_tokens or 0),
        cache_saved_usd=float(saved_usd or 0.0),
    )


def _nested(rows: list[tuple[Any, ...]]) -> dict[Any, dict[Any, Any]]:
    out: dict[Any, dict[Any, Any]] = {}
    for group, key, value in rows:
        out.setdefault(group, {})[key] = value
    return out


@attrs.frozen(kw_only=True)
class _Tally:
    """What an hour (or a day: its hours added up) holds: jobs, answers, and of the answers those
    served by free capacity and by the paid fallback, their attempts; the paid cost of all jobs."""

    jobs: int = 0
    answered: int = 0
    free: int = 0
    paid: int = 0
    attempts: int = 0
    cost_usd: float = 0.0

    def __add__(self, other: _Tally) -> _Tally:
        return _Tally(
            **{f.name: getattr(self, f.name) + getattr(other, f.name) for f in attrs.fields(_Tally)}
        )

    def measures(self) -> dict[str, Any]:
        return {
            "jobs": self.jobs,
            "answered": self.answered,
            "free_share": _share(self.free, self.answered),
            "paid_share": _share(self.paid, self.answered),
            "paid_cost_usd": self.cost_usd,
            "attempts_per_answer": _share(self.attempts, self.answered),
        }


def _hours(query: Query, hour: int, dim: str) -> dict[int, _Tally]:
    """Every hour since `hour` that saw a job, in order (`dim`: "all", or a client's own)."""
    rows = query(
        "SELECT hour, SUM(jobs), SUM(CASE WHEN outcome = 'ok' THEN jobs END), "
        "SUM(CASE WHEN outcome = 'ok' AND tier IN ('local', 'free') THEN jobs END), "
        "SUM(CASE WHEN outcome = 'ok' AND route = 'paid_fallback' THEN jobs END), "
        "SUM(CASE WHEN outcome = 'ok' THEN attempts END), COALESCE(SUM(cost_usd), 0) "
        "FROM audit_jobs_hourly WHERE dim = ? AND hour >= ? GROUP BY 1 ORDER BY 1",
        (dim, hour),
    )
    return {
        int(h): _Tally(
            jobs=jobs or 0,
            answered=ok or 0,
            free=free or 0,
            paid=paid or 0,
            attempts=attempts or 0,
            cost_usd=float(cost or 0.0),
        )
        for h, jobs, ok, free, paid, attempts, cost in rows
    }


def _hour(hour: int, tally: _Tally) -> Hour:
    return Hour(hour=hour * 3600.0, **tally.measures())


def _days(hours: dict[int, _Tally], ceiling_usd: float) -> tuple[Day, ...]:
    """The hours added up per UTC day, in order."""
    days: dict[int, _Tally] = {}
    for hour, tally in hours.items():
        days[hour // 24] = days.get(hour // 24, _Tally()) + tally
    return tuple(
        Day(
            day=dt.datetime.fromtimestamp(day * DAY_S, dt.UTC).strftime("%Y-%m-%d"),
            ceiling_usd=ceiling_usd,
            **tally.measures(),
        )
        for day, tally in days.items()
    )


# -- the story of one request ----------------------------------------------------------------------


def explain(query: Query, request_id: str) -> dict[str, Any] | None:
    """Everything the audit knows of one job, or None: the plan after filters (and why each other
    candidate was left out), every skip with its reason, every attempt (lane, model, route state,
    outcome, latency, tokens, cost), the consent decision, the paid spend before and after, and a
    one-line summary. Hashes and byte counts only, never a body."""
    columns = (
        "job",
        "at",
        "client",
        "cohort",
        "class",
        "route",
        "outcome",
        "lane",
        "model",
        "tier",
        "privacy",
        "zdr",
        "request_sha256",
        "request_bytes",
        "answer_sha256",
        "answer_bytes",
        "attempts",
        "skip_log",
        "plan",
        "latency_s",
        "tokens",
        "cost_usd",
        "paid_before_usd",
        "paid_after_usd",
        "approval",
        "dropped",
    )
    rows = query(f"SELECT {', '.join(columns)} FROM audit WHERE job = ?", (request_id,))
    if not rows:
        return None
    job = dict(zip(columns, rows[0], strict=True))
    job_facts = ("job", "at", "client", "cohort", "class")  # in `job` already
    attempt_columns = [c for c in ATTEMPT_COLUMNS if c not in job_facts]
    attempts = [
        dict(zip(attempt_columns, row, strict=True))
        for row in query(
            f"SELECT {', '.join(attempt_columns)} FROM audit_attempt WHERE job = ? ORDER BY n",
            (request_id,),
        )
    ]
    skips = json.loads(job.pop("skip_log") or "[]")
    job["plan"] = json.loads(job["plan"] or "[]")
    job["dropped"] = json.loads(job["dropped"] or "[]")  # a row an older version wrote: none
    job["skips"] = skips
    job["attempt_list"] = attempts
    job["summary"] = _summary(job, attempts)
    return job


def _summary(job: dict[str, Any], attempts: list[dict[str, Any]]) -> str:
    steps = []
    for a in attempts:
        why = a["category"] or a["outcome"]
        retry = " (same-candidate retry)" if a["retry"] else ""
        steps.append(
            f"{a['route']} {a['lane']}/{a['model']}{retry}: "
            f"{'served' if a['outcome'] == 'ok' else why}"
        )
    cost = f"${job['cost_usd']:.6f}"
    if job["outcome"] == "ok":
        head = f"answered by {job['lane']}/{job['model']} on the {job['route']} route"
    elif job["outcome"] == "abandoned":
        head = "not answered (abandoned: the client went away, and the job was cancelled)"
    else:
        head = f"not answered ({job['outcome']})"
    consent = f"; paid consent: {job['approval']}" if job["approval"] else ""
    return f"{head} after {len(attempts)} attempt(s), {cost}{consent}" + (
        " — " + "; ".join(steps) if steps else ""
    )


MAX_SINCE_S = 100 * 365 * DAY_S


def parse_since(value: str, now: float) -> float:
    """`1d`, `7d`, `12h`, `30m` (before `now`) or a UTC date `2026-11-01`, as epoch seconds."""
    value = value.strip()
    units = {"d": DAY_S, "h": 3600.0, "m": 60.0}
    if value[:-1].isascii() and value[:-1].isdigit() and value[-1:] in units:
        if len(value) > 9 or int(value[:-1]) * units[value[-1]] > MAX_SINCE_S:
            raise ValueError(f"since reaches back at most 100 years (got {value[:12]!r})")
        return now - int(value[:-1]) * units[value[-1]]
    try:
        return dt.datetime.strptime(value, "%Y-%m-%d").replace(tzinfo=dt.UTC).timestamp()
    except ValueError:
        raise ValueError(
            f"since must be like 1d, 7d, 12h or a date such as 2026-11-01 (got {value[:40]!r})"
        ) from None

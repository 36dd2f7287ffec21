"""The audit: one record per job — who, which class and cohort, hashes and sizes (never bodies
unless `log_bodies`), the route reached, every attempt, latency, tokens, cost, approval — and the
queries seed 004 asks for, run over it.
"""

from __future__ import annotations

# lanes: pure
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lanes._core.job import Attempt, Job, digest
from lanes.freetier.prices import usage_tokens

Query = Callable[[str, tuple[Any, ...]], list[tuple[Any, ...]]]


def attempt_log(attempts: Sequence[Attempt]) -> list[dict[str, Any]]:
    """Each attempt with the route state it stood for (local / primary / free_retry /
    paid_fallback)."""
    return [
        {
            "lane": a.lane,
            "model": a.model,
            "tier": a.tier,
            "route": a.route,
            "outcome": a.outcome,
            "status": a.status,
            "latency_s": round(a.duration_s, 6),
            "category": a.category,
            "retry": a.retry,
            "cost_usd": a.cost_usd,
        }
        for a in attempts
    ]


def audit_row(
    *,
    job: Job,
    at: float,
    request_class: str,
    outcome: str,
    route: str | None,
    lane: str | None,
    model: str | None,
    attempts: Sequence[Attempt],
    latency_s: float,
    skips: Sequence[Any] = (),
    answer: Any = None,
    usage: Mapping[str, Any] | None = None,
    cost_usd: float = 0.0,
    approval: str = "",
    explored: bool = False,
    log_bodies: bool = False,
) -> dict[str, Any]:
    request_sha, request_bytes = job.fingerprint()
    answer_sha, answer_bytes = digest(answer) if answer is not None else ("", 0)
    counted = usage_tokens(usage)
    return {
        "job": job.id,
        "at": at,
        "client": job.client,
        "cohort": job.cohort or "",
        "class": request_class,
        "route": route or "",
        "outcome": outcome,
        "lane": lane or "",
        "model": model or "",
        "request_sha256": request_sha,
        "request_bytes": request_bytes,
        "answer_sha256": answer_sha,
        "answer_bytes": answer_bytes,
        "attempts": len(attempts),
        "attempt_log": json.dumps(attempt_log(attempts)),
        "skip_log": json.dumps(
            [{"lane": s.lane, "model": s.model, "reason": s.reason} for s in skips]
        ),
        "latency_s": latency_s,
        "tokens": sum(counted) if counted else 0,
        "cost_usd": cost_usd,
        "approval": approval,
        "explored": int(explored),
        "body": json.dumps(
            {"input" if job.embedding else "messages": job.request(), "answer": answer}
        )
        if log_bodies
        else "",
    }


# -- seed 004's measures -------------------------------------------------------------------------


def primary_success_by_class(query: Query) -> dict[str, float]:
    """Share of jobs per class answered by their free primary (first attempt, free, ok)."""
    rows = query("SELECT class, attempt_log FROM audit", ())
    totals: dict[str, list[int]] = {}
    for klass, raw in rows:
        log = json.loads(raw)
        first_free = next((a for a in log if a["tier"] == "free"), None)
        if first_free is None:
            continue
        t = totals.setdefault(klass, [0, 0])
        t[0] += first_free["outcome"] == "ok"
        t[1] += 1
    return {k: ok / n for k, (ok, n) in totals.items()}


def free_retry_rate_and_reasons(query: Query) -> tuple[float, dict[str, int]]:
    """Share of jobs that needed a free retry, and why the primary failed."""
    rows = query("SELECT attempt_log FROM audit", ())
    retried, reasons = 0, dict[str, int]()
    for (raw,) in rows:
        log = json.loads(raw)
        free = [a for a in log if a["tier"] == "free"]
        if len(free) > 1:
            retried += 1
            reasons[free[0]["outcome"]] = reasons.get(free[0]["outcome"], 0) + 1
    return (retried / len(rows) if rows else 0.0), reasons


def paid_fallback(query: Query) -> dict[str, float]:
    """How often jobs ended on the paid fallback, and what it cost."""
    ((jobs, paid, cost),) = query(
        "SELECT COUNT(*), SUM(route = 'paid_fallback'), COALESCE(SUM(cost_usd), 0) FROM audit", ()
    )
    return {
        "jobs": jobs,
        "paid_jobs": paid or 0,
        "paid_share": (paid or 0) / jobs if jobs else 0.0,
        "cost_usd": cost,
    }


def latency_per_state(query: Query) -> dict[str, float]:
    """Mean attempt latency (s) per route state."""
    sums: dict[str, list[float]] = {}
    for (raw,) in query("SELECT attempt_log FROM audit", ()):
        for a in json.loads(raw):
            s = sums.setdefault(a["route"], [0.0, 0])
            s[0] += a["latency_s"]
            s[1] += 1
    return {route: total / n for route, (total, n) in sums.items()}


def error_categories(query: Query) -> dict[str, int]:
    """Failed attempts by outcome class (fault, rate_limited, credit_exhausted, deadline, …)."""
    counts: dict[str, int] = {}
    for (raw,) in query("SELECT attempt_log FROM audit", ()):
        for a in json.loads(raw):
            if a["outcome"] != "ok":
                counts[a["outcome"]] = counts.get(a["outcome"], 0) + 1
    return counts


def attempts_per_success(query: Query) -> float:
    ((value,),) = query("SELECT AVG(attempts) FROM audit WHERE outcome = 'ok'", ())
    return value or 0.0


def by_cohort(query: Query) -> dict[str, dict[str, float]]:
    """Per cohort: jobs, paid jobs and paid cost — cost attributed to the job's own cohort."""
    rows = query(
        "SELECT cohort, COUNT(*), SUM(route = 'paid_fallback'), COALESCE(SUM(cost_usd), 0) "
        "FROM audit GROUP BY cohort",
        (),
    )
    return {
        cohort: {"jobs": n, "paid_jobs": paid or 0, "cost_usd": cost}
        for cohort, n, paid, cost in rows
    }

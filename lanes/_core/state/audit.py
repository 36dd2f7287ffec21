"""The audit: one record per job — who, which class and cohort, hashes and sizes (never bodies
unless `log_bodies`), the route reached, every attempt, latency, tokens, cost, approval. The
measures seed 004 asks for are computed over it in `report.py`; the tables are documented in
docs/audit.md.
"""

from __future__ import annotations

# lanes: pure
import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import attrs

from lanes._core.freetier.prices import usage_tokens
from lanes._core.model.candidates import Attempt, Candidate
from lanes._core.model.job import Job, digest
from lanes._core.policy.needs import max_output_tokens

#: Between a dimension and a client's name in the roll-ups' dimension of that client's jobs.
CLIENT_SEP = "\x1f"
#: The columns of `audit_attempt` (`audit_tables.py`): what each of a row's `attempt_rows` holds.
ATTEMPT_COLUMNS = (
    "job",
    "n",
    "at",
    "client",
    "cohort",
    "class",
    "lane",
    "model",
    "tier",
    "route",
    "outcome",
    "category",
    "status",
    "retry",
    "latency_s",
    "tokens",
    "cost_usd",
    "work",
)
#: What a report can group by; each job (and attempt) is rolled up once per dimension, and once
#: more under ("all", "all") for the totals — and each of those again under its client's own
#: dimension (`client_dim`), so a client's report reads only its own jobs.
DIMENSIONS = ("cohort", "class", "lane", "model", "client", "work")


class AuditedJob(Protocol):
    """What an audit row reads of a job: a `Job`, or the `JobFacts` kept of one."""

    @property
    def id(self) -> str: ...
    @property
    def client(self) -> str: ...
    @property
    def cohort(self) -> str | None: ...
    @property
    def model(self) -> str: ...
    @property
    def embedding(self) -> bool: ...
    @property
    def free_only(self) -> bool: ...
    @property
    def params(self) -> Mapping[str, Any]: ...
    @property
    def dropped(self) -> tuple[str, ...]: ...
    def fingerprint(self) -> tuple[str, int]: ...
    def request(self) -> Any: ...


@attrs.frozen(kw_only=True)
class JobFacts:
    """What the audit keeps of a finished job until its row is written: names, the output cap
    and the request's digest — never its messages or keys (but for `log_bodies`)."""

    id: str
    client: str
    cohort: str | None
    model: str
    embedding: bool
    free_only: bool  # work that can wait (a batch item)
    params: Mapping[str, Any]  # the output cap only
    dropped: tuple[str, ...]
    digest: tuple[str, int]
    body: Any = None  # the request itself, kept only when bodies are logged

    @classmethod
    def of(cls, job: Job, *, keep_body: bool = False) -> JobFacts:
        cap = max_output_tokens(job.params)
        return cls(
            id=job.id,
            client=job.client,
            cohort=job.cohort,
            model=job.model,
            embedding=job.embedding,
            free_only=job.free_only,
            params={"max_tokens": cap} if cap else {},
            dropped=job.dropped,
            digest=job.fingerprint(),
            body=job.request() if keep_body else None,
        )

    def fingerprint(self) -> tuple[str, int]:
        return self.digest

    def request(self) -> Any:
        return self.body


def work_of(job: AuditedJob) -> str:
    """The audit's `work` of a job: `batch` (work that can wait: a batch item, sidecar or
    library) or `interactive`."""
    return "batch" if job.free_only else "interactive"


def client_dim(dim: str, client: str) -> str:
    """The hourly roll-ups' dimension `dim` of one client's jobs only, e.g. "cohort\x1fci": what
    a client's own report reads (see `audit_tables.py`)."""
    return f"{dim}{CLIENT_SEP}{client}"


@functools.lru_cache(maxsize=256)
def _plan_json(considered: tuple[str, ...]) -> str:
    """A plan's keys as JSON: most jobs of an alias share one plan."""
    return json.dumps(list(considered))


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
    job: AuditedJob,
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
    answer_digest: tuple[str, int] | None = None,
    usage: Mapping[str, Any] | None = None,
    cost_usd: float = 0.0,
    approval: str = "",
    explored: bool = False,
    log_bodies: bool = False,
    privacy: str = "any",
    served: Candidate | None = None,
    considered: Sequence[str] = (),
    paid_before: float | None = None,
    paid_after: float | None = None,
    streamed: bool = False,
    deadline_s: float | None = None,
    saved_usd: float = 0.0,
) -> dict[str, Any]:
    """One job's audit row (table `audit`, documented in docs/audit.md). Its attempts ride along
    under `attempt_rows`, for the table `audit_attempt`. `answer_digest`: the answer's `digest`,
    when it was taken already (the answer itself is then needed only for `log_bodies`)."""
    request_sha, request_bytes = job.fingerprint()
    if answer_digest is None:
        answer_digest = digest(answer) if answer is not None else ("", 0)
    answer_sha, answer_bytes = answer_digest
    counted = usage_tokens(usage)
    free = [a for a in attempts if a.tier == "free"]
    work = work_of(job)
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
        "tier": served.tier if served and outcome == "ok" else "",
        "privacy": privacy,
        "zdr": int(bool(served and outcome == "ok" and (served.zdr or served.tier == "local"))),
        "request_sha256": request_sha,
        "request_bytes": request_bytes,
        "answer_sha256": answer_sha,
        "answer_bytes": answer_bytes,
        "attempts": len(attempts),
        "free_attempts": len({a.key for a in free}),
        "first_free_outcome": free[0].outcome if free else "",
        "attempt_log": json.dumps(attempt_log(attempts)),
        "skip_log": json.dumps(
            [{"lane": s.lane, "model": s.model, "reason": s.reason} for s in skips]
        )
        if skips
        else "[]",
        "plan": _plan_json(tuple(considered)),
        "dropped": json.dumps(list(job.dropped)) if job.dropped else "[]",
        "latency_s": latency_s,
        "tokens": sum(counted) if counted else 0,
        # what a replay (`lanes whatif`) needs to ask the same again: no body, only its shape
        "asked": job.model,
        "embedding": int(job.embedding),
        "streamed": int(streamed),
        "max_tokens": max_output_tokens(job.params),
        "deadline_s": deadline_s,
        "prompt_tokens": counted[0] if counted else None,
        "completion_tokens": counted[1] if counted else None,
        "cost_usd": cost_usd,
        "saved_usd": saved_usd,
        "paid_before_usd": paid_before,
        "paid_after_usd": paid_after,
        "approval": approval,
        "explored": int(explored),
        "work": work,
        "body": json.dumps(
            {"input" if job.embedding else "messages": job.request(), "answer": answer}
        )
        if log_bodies
        else "",
        "attempt_rows": [
            {
                "job": job.id,
                "n": n,
                "at": at,
                "client": job.client,
                "cohort": job.cohort or "",
                "class": request_class,
                "lane": a.lane,
                "model": a.model,
                "tier": a.tier,
                "route": a.route,
                "outcome": a.outcome,
                "category": a.category,
                "status": a.status,
                "retry": int(a.retry),
                "latency_s": a.duration_s,
                "tokens": a.tokens,
                "cost_usd": a.cost_usd,
                "work": work,
            }
            for n, a in enumerate(attempts)
        ],
    }

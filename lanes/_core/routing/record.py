"""One job's walk through its candidates: what was sent, what was skipped, and the error at the end."""

from __future__ import annotations

from typing import Any

import trio

from lanes._core.errors import DeadlineExceeded, FreeTierExhausted, NoLaneAvailable, PaidBudgetExhausted
from lanes._core.job import Attempt, Candidate, Job, Outcome, Skip


class Walk:
    """One job's progress through its candidates: what was sent, what was skipped, and when."""

    def __init__(self, job: Job, deadline_at: float) -> None:
        self.job = job
        self.deadline_at = deadline_at
        self.attempts: list[Attempt] = []
        self.skips: list[Skip] = []
        self.short_of_time = False
        self.free_blocked: list[Candidate] = []  # free candidates the manager held back
        self.request_class = "general"
        self.approval: str | None = None  # how paid fallback was consented to: allow, once, granted
        self.budget_refusal: PaidBudgetExhausted | None = None  # the paid ceiling refused an attempt
        self.last_error: Exception | None = None
        self.started_at = trio.current_time()
        self.explored: str | None = None  # the runner-up this job was sent to on purpose
        self.sticky = False  # a multi-turn conversation kept on the model that served it

    @property
    def free_attempts(self) -> int:
        return sum(1 for a in self.attempts if a.tier == "free")

    @property
    def paid_attempts(self) -> int:
        return sum(1 for a in self.attempts if a.tier == "paid")

    def skip(self, candidate: Candidate, reason: str) -> None:
        self.skips.append(Skip(lane=candidate.lane, model=candidate.model, reason=reason))

    def record(self, candidate: Candidate, outcome: Outcome, started_at: float, **kw: Any) -> None:
        self.attempts.append(
            Attempt(
                lane=candidate.lane,
                model=candidate.model,
                tier=candidate.tier,
                outcome=outcome,
                duration_s=trio.current_time() - started_at,
                **kw,
            )
        )

    def failed(self, next_free: tuple[float, str] | None = None, now_wall: float = 0.0) -> Exception:
        """The error for a walk that ran out of candidates."""
        kw = {"attempts": self.attempts, "skips": self.skips}
        ran_out = trio.current_time() >= self.deadline_at or self.short_of_time
        if ran_out or any(a.outcome == "deadline" for a in self.attempts):
            return DeadlineExceeded("the job's deadline passed before any lane answered", **kw)
        if self.budget_refusal is not None:
            refusal = self.budget_refusal
            return PaidBudgetExhausted(str(refusal), retry_after_s=refusal.retry_after_s, **kw)
        if self.free_blocked or any(a.outcome in ("rate_limited", "credit_exhausted") for a in self.attempts):
            retry = max(0.0, next_free[0] - now_wall) if next_free else None
            when = f"; {next_free[1]} reopens in {retry:.1f}s" if next_free else ""
            return FreeTierExhausted(f"free capacity is exhausted{when}", retry_after_s=retry,
                                     next_eligible=next_free[1] if next_free else None, **kw)
        tried = len(self.attempts)
        return NoLaneAvailable(f"no lane could serve: {tried} attempt(s), {len(self.skips)} skip(s)", **kw)

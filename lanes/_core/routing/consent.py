"""Consent for paid fallback: pending approvals, decisions, grants and "approve once".

Under `free_tier_fallback = "ask"` a job that needs a paid candidate asks for it by name, with the
worst case it may cost (always within what is left of today's ceiling), and waits for a decision up
to its deadline (or `approval_wait_s`). Jobs of one client asking for the same request (the same
fingerprint, or a retry carrying the approval's id in `X-Lanes-Approval`) share one approval, which
disappears when the last of their deadlines passes. A decision:

- `once` lets the jobs waiting on it use that candidate; when none waits any more (the client got
  its 429), it is kept in the store for the client's next request for the same job — consumed by
  exactly one request, on any process or host;
- a duration grants the client paid fallback until then (kept in the store; listed and revoked
  with `grants()` / `revoke()`);
- `deny` refuses the jobs waiting on it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from lanes._core.errors import FallbackDenied, FallbackNeedsApproval
from lanes._core.job import Candidate, Job
from lanes._core.routing.approvals import Approvals
from lanes._core.routing.policy import PolicyConfig
from lanes._core.routing.record import JobRecord


class Consent:
    """Whether a job may fall back to a paid candidate: `free_tier_fallback` off, ask or allow."""

    def __init__(
        self, policy: PolicyConfig, approvals: Approvals, next_free_s: Callable[[Job], float | None]
    ) -> None:
        self.policy = policy
        self.approvals = approvals
        self._next_free_s = next_free_s  # seconds until the job's soonest free candidate reopens

    async def ask(
        self, record: JobRecord, candidate: Candidate, *, estimate: float, min_time_s: float
    ) -> bool:
        """True when `record`'s job may pay for `candidate` (worst case `estimate` USD); False
        (the skip recorded) when fallback is off or too little time is left to ask. Under `ask`,
        waits for a decision up to the deadline (or `approval_wait_s`) and raises
        `FallbackNeedsApproval` when none came, `FallbackDenied` when it was denied."""
        mode, job = self.policy.free_tier_fallback, record.job
        if record.approval in ("allow", "granted") or record.approved == candidate.key:
            return True
        if mode == "allow":
            record.approval = "allow"
            return True
        if mode == "off":
            record.skip(candidate, "paid fallback off (free_tier_fallback = off)")
            return False
        if self.approvals.granted(job.client):
            record.approval = "granted"
            return True
        if await self.approvals.take_once(job, candidate.key):
            record.approval, record.approved = "once", candidate.key
            return True
        if record.deadline_at - trio.current_time() < min_time_s:
            record.short_of_time = True
            record.skip(candidate, "too little time left to ask for approval")
            return False
        return await self._wait(record, candidate, estimate)

    async def _wait(self, record: JobRecord, candidate: Candidate, estimate: float) -> bool:
        job = record.job
        exhausted = tuple(
            dict.fromkeys(
                [
                    *(c.key for c in record.free_blocked),
                    *(a.key for a in record.attempts if a.tier != "paid"),
                ]
            )
        )
        approval = await self.approvals.open(
            job=job,
            exhausted=exhausted,
            candidate=candidate.key,
            cost=estimate,
            deadline_at=record.deadline_at,
        )
        wait_s = self.policy.approval_wait_s
        until = (
            record.deadline_at
            if wait_s is None
            else min(record.deadline_at, trio.current_time() + wait_s)
        )
        approval.waiting += 1
        try:
            with trio.move_on_at(until):
                await approval.event.wait()
        finally:
            approval.waiting -= 1
        kw: dict[str, Any] = {
            "attempts": record.attempts,
            "skips": record.skips,
            "request_id": record.id,
        }
        if approval.decision is None:
            raise FallbackNeedsApproval(
                f"paid fallback to {approval.candidate} "
                f"(at most ${approval.estimated_cost_usd:.6f}) "
                f"needs approval {approval.id}",
                approval_id=approval.id,
                retry_after_s=max(1.0, self._next_free_s(job) or 30.0),
                **kw,
            )
        if approval.decision == "deny":
            raise FallbackDenied(
                f"paid fallback to {approval.candidate} was denied ({approval.id})", **kw
            )
        record.approval = approval.decision
        if approval.decision == "granted":
            return True
        if approval.candidate != candidate.key:  # "once" names the model it lets through
            record.skip(candidate, f"the approval is for {approval.candidate}")
            return False
        record.approved = candidate.key
        return True

"""Consent for paid fallback: pending approvals, decisions, grants and "approve once".

Under `free_tier_fallback = "ask"` a job that needs a paid candidate asks for it by name, with the
worst case it may cost (always within what is left of today's ceiling), and waits for a decision up
to its deadline (or `approval_wait_s`). Jobs of one client asking for the very same request (the
same fingerprint: model, messages or input, and every parameter) share one approval, which
disappears when the last of their deadlines passes; a retry naming it (`X-Lanes-Approval`) joins it
only when it is that request. A decision:

- `once` pays for exactly one request, on any process or host: the first job waiting on it that
  takes it, else (kept in the store for `once_ttl_s`) the client's first retry of that request —
  the same fingerprint, on the model approved, at a worst case no higher than the one approved.
  Every other job waiting on it is answered at once with a fresh approval to ask for (429
  `approval_required`), never paid; a retry whose `X-Lanes-Approval` can not be used is asked for
  a new approval, and its error says why;
- a duration grants the client paid fallback until then, for every request (kept in the store;
  listed and revoked with `grants()` / `revoke()`);
- `deny` refuses the jobs waiting on it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from lanes._core.model.candidates import Candidate
from lanes._core.model.errors import FallbackDenied, FallbackNeedsApproval
from lanes._core.model.job import Job
from lanes._core.model.record import JobRecord
from lanes._core.money.approvals import PendingApproval, PendingApprovals
from lanes._core.policy.policy import PolicyConfig
from lanes._core.state.store import OnceConsent

_OTHER_REQUEST = "it was asked for another request (the body, model or parameters differ)"


class Consent:
    """Whether a job may fall back to a paid candidate: `free_tier_fallback` off, ask or allow."""

    def __init__(
        self,
        policy: Callable[[], PolicyConfig],
        approvals: PendingApprovals,
        next_free_s: Callable[[Job], float | None],
    ) -> None:
        """`policy` is the policy in force (its consent mode and waits), read at every ask."""
        self._policy = policy
        self._approvals = approvals
        self._next_free_s = next_free_s  # seconds until the job's soonest free candidate reopens

    async def ask(
        self, record: JobRecord, candidate: Candidate, *, estimate: float, min_time_s: float
    ) -> bool:
        """True when `record`'s job may pay for `candidate` (worst case `estimate` USD); False
        (the skip recorded) when fallback is off or too little time is left to ask. Under `ask`,
        waits for a decision up to the deadline (or `approval_wait_s`) and raises
        `FallbackNeedsApproval` when none came, `FallbackDenied` when it was denied."""
        mode, job = self._policy().free_tier_fallback, record.job
        if record.approval == "allow" or record.approved == candidate.key:
            return True
        if record.approval == "granted" and self._approvals.granted(job.client):
            return True  # still granted: a grant revoked since the job began pays for nothing more
        if mode == "allow":
            record.consented("allow")
            return True
        if mode == "off":
            record.skip(candidate, "paid fallback off (free_tier_fallback = off)")
            return False
        if self._approvals.granted(job.client):
            record.consented("granted")
            return True
        if await self._approvals.take_once(job, candidate.key, estimate):
            record.consented("once", candidate)
            return True
        if record.deadline_at - trio.current_time() < min_time_s:
            record.short_of()
            record.skip(candidate, "too little time left to ask for approval")
            return False
        unusable = await self._unusable(job, candidate.key, estimate)
        note = f"X-Lanes-Approval {job.approval} can not pay for it: {unusable}" if unusable else ""
        return await self._wait(record, candidate, estimate, note)

    async def _unusable(self, job: Job, candidate: str, cost: float) -> str:
        """Why the approval `job` names (`X-Lanes-Approval`) can not pay for it on `candidate` at
        a worst case of `cost` USD; "" when it names none, or a pending one it joins."""
        if job.approval is None:
            return ""
        fingerprint = job.request_fingerprint()
        for asked in self._approvals.pending():
            if asked.id == job.approval and asked.client == job.client:
                return "" if asked.fingerprint == fingerprint else _OTHER_REQUEST
        once = await self._approvals.kept_once(job.approval, job.client)
        return why_not(once, candidate=candidate, fingerprint=fingerprint, cost=cost)

    async def _open(
        self, record: JobRecord, candidate: Candidate, estimate: float
    ) -> PendingApproval:
        """The approval `record`'s job asks for (joined, or new)."""
        exhausted = tuple(
            dict.fromkeys(
                [
                    *(c.key for c in record.free_blocked),
                    *(a.key for a in record.attempts if a.tier != "paid"),
                ]
            )
        )
        return await self._approvals.open(
            job=record.job,
            exhausted=exhausted,
            candidate=candidate.key,
            cost=estimate,
            deadline_at=record.deadline_at,
        )

    async def _wait(
        self, record: JobRecord, candidate: Candidate, estimate: float, note: str
    ) -> bool:
        job = record.job
        approval = await self._open(record, candidate, estimate)
        wait_s = self._policy().approval_wait_s
        until = (
            record.deadline_at
            if wait_s is None
            else min(record.deadline_at, trio.current_time() + wait_s)
        )
        waited_from = trio.current_time()
        try:
            await approval.wait(until)
        finally:
            record.waited(waited_from, trio.current_time(), approval.id)
        kw: dict[str, Any] = {
            "attempts": record.attempts,
            "skips": record.skips,
            "request_id": record.id,
        }
        if approval.decision is None:
            raise self._needs(approval, job, note, kw)
        if approval.decision == "deny":
            raise FallbackDenied(
                f"paid fallback to {approval.candidate} was denied ({approval.id})", **kw
            )
        if approval.decision == "granted":
            record.consented("granted")
            return True
        if approval.candidate != candidate.key:  # "once" names the model it lets through
            record.skip(candidate, f"the approval is for {approval.candidate}")
            return False
        if not await self._approvals.use_once(approval, job, candidate.key, estimate):
            fresh = await self._open(record, candidate, estimate)  # another job took the "once"
            used = f"{approval.id} was approved once, and another request used it"
            raise self._needs(fresh, job, used, kw)
        record.consented("once", candidate)
        return True

    def _needs(
        self, approval: PendingApproval, job: Job, note: str, kw: dict[str, Any]
    ) -> FallbackNeedsApproval:
        """The 429 that asks for `approval` (`note`: why an earlier one did not pay)."""
        return FallbackNeedsApproval(
            f"paid fallback to {approval.candidate} "
            f"(at most ${approval.estimated_cost_usd:.6f}) "
            f"needs approval {approval.id}" + (f"; {note}" if note else ""),
            approval_id=approval.id,
            retry_after_s=max(1.0, self._next_free_s(job) or 30.0),
            **kw,
        )


def why_not(once: OnceConsent | None, *, candidate: str, fingerprint: str, cost: float) -> str:
    """Why `once` (the unused "approve once" a retry names; None: there is none) can not pay for a
    request `fingerprint` on `candidate` whose worst case is `cost` USD ("" when it can)."""
    if once is None:
        return "no unused approval by that id (never approved once, used, revoked or expired)"
    if once.cost_usd is None:
        return "it was kept without its estimate (by an older version)"
    if once.candidate != candidate:
        return f"it approved {once.candidate}, not {candidate}"
    if once.fingerprint != fingerprint:
        return _OTHER_REQUEST
    if cost > once.cost_usd + 1e-12:
        return f"this request may cost ${cost:.6f}, more than the ${once.cost_usd:.6f} approved"
    return ""

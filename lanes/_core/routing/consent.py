"""Consent for paid fallback: pending approvals, decisions, and time-based grants per client.

A job that needs paid fallback under `free_tier_fallback = "ask"` waits for a decision up to its
deadline. Jobs of one client share one pending approval: "once" lets every job waiting on it
through, a duration grants the client paid fallback until then (persisted in the store, so a
restart keeps it), "deny" refuses them.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any, Literal

import attrs
import trio

from lanes._core.clocks import EpochTime
from lanes._core.errors import FallbackDenied, FallbackNeedsApproval
from lanes._core.job import Candidate, Job
from lanes._core.routing.policy import PolicyConfig, worst_case_cost
from lanes._core.routing.record import JobRecord
from lanes._core.state.store import Store

Decision = Literal["once", "granted", "deny"]


@attrs.define(kw_only=True)
class PendingApproval:
    id: str
    client: str
    exhausted: tuple[str, ...]  # the free candidates that were held back or failed
    candidate: str  # the paid "lane/model" that would serve
    estimated_cost_usd: float
    created_at: float  # wall-clock epoch seconds
    event: trio.Event = attrs.field(factory=trio.Event)
    decision: Decision | None = None


class Approvals:
    def __init__(self, store: Store, now_wall: Callable[[], EpochTime]) -> None:
        self._store = store
        self._now = now_wall
        self.pending: dict[str, PendingApproval] = {}

    def granted(self, client: str) -> bool:
        until = self._store.grant_until(client)
        return until is not None and until > self._now()

    def open(
        self, *, client: str, exhausted: tuple[str, ...], candidate: str, cost: float
    ) -> PendingApproval:
        """The client's pending approval (created when there is none)."""
        for approval in self.pending.values():
            if approval.client == client:
                return approval
        approval = PendingApproval(
            id=f"ap-{secrets.token_hex(12)}",
            client=client,
            exhausted=exhausted,
            candidate=candidate,
            estimated_cost_usd=cost,
            created_at=self._now(),
        )
        self.pending[approval.id] = approval
        return approval

    def decide(
        self, approval_id: str, decision: Literal["once", "deny"] | float
    ) -> PendingApproval:
        """Decide: "once", "deny", or a duration in seconds that grants the client until then.

        Raises KeyError for an unknown (or already decided) approval id.
        """
        approval = self.pending.pop(approval_id)
        if isinstance(decision, (int, float)) and not isinstance(decision, bool):
            if decision <= 0:
                raise ValueError(f"an approval duration must be > 0 seconds (got {decision})")
            self._store.put_grant(approval.client, self._now() + float(decision))
            approval.decision = "granted"
        elif decision in ("once", "deny"):
            approval.decision = decision
        else:
            self.pending[approval_id] = approval
            raise ValueError(
                f"decision must be 'once', 'deny' or a duration in seconds (got {decision!r})"
            )
        approval.event.set()
        return approval


class Consent:
    """Whether a job may fall back to a paid candidate: `free_tier_fallback` off, ask or allow."""

    def __init__(
        self, policy: PolicyConfig, approvals: Approvals, next_free_s: Callable[[Job], float | None]
    ) -> None:
        self.policy = policy
        self.approvals = approvals
        self._next_free_s = next_free_s  # seconds until the job's soonest free candidate reopens

    async def ask(self, record: JobRecord, candidate: Candidate) -> bool:
        """True when `record`'s job may pay for `candidate`; False (skip recorded) when fallback is
        off. Under `ask`, waits for a decision up to the job's deadline (or `approval_wait_s`) and
        raises `FallbackNeedsApproval` when none came, `FallbackDenied` when it was denied."""
        mode = self.policy.free_tier_fallback
        if mode == "allow":
            record.approval = "allow"
            return True
        if mode == "off":
            record.skip(candidate, "paid fallback off (free_tier_fallback = off)")
            return False
        client = record.job.client
        if self.approvals.granted(client):
            record.approval = "granted"
            return True
        exhausted = tuple(
            dict.fromkeys(
                [
                    *(c.key for c in record.free_blocked),
                    *(a.key for a in record.attempts if a.tier != "paid"),
                ]
            )
        )
        cost = worst_case_cost(candidate, record.job, self.policy.paid_max_tokens) or 0.0
        approval = self.approvals.open(
            client=client, exhausted=exhausted, candidate=candidate.key, cost=cost
        )
        wait_s = self.policy.approval_wait_s
        until = (
            record.deadline_at
            if wait_s is None
            else min(record.deadline_at, trio.current_time() + wait_s)
        )
        with trio.move_on_at(until):
            await approval.event.wait()
        kw: dict[str, Any] = {
            "attempts": record.attempts,
            "skips": record.skips,
            "request_id": record.id,
        }
        if approval.decision is None:
            raise FallbackNeedsApproval(
                f"paid fallback to {candidate.key} needs approval {approval.id}",
                approval_id=approval.id,
                retry_after_s=max(1.0, self._next_free_s(record.job) or 30.0),
                **kw,
            )
        if approval.decision == "deny":
            raise FallbackDenied(
                f"paid fallback to {candidate.key} was denied ({approval.id})", **kw
            )
        record.approval = approval.decision
        return True

"""Consent for paid fallback: pending approvals, decisions, and time-based grants per client.

A job that needs paid fallback under `free_tier_fallback = "ask"` waits for a decision up to its
deadline. Jobs of one client share one pending approval: "once" lets every job waiting on it
through, a duration grants the client paid fallback until then (persisted in the store, so a
restart keeps it), "deny" refuses them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Literal

import attrs
import trio

from lanes._core.state.store import Store

Decision = Literal["once", "granted", "deny"]
_ids = itertools.count(1)


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
    def __init__(self, store: Store, now_wall: Callable[[], float]) -> None:
        self._store = store
        self._now = now_wall
        self.pending: dict[str, PendingApproval] = {}

    def granted(self, client: str) -> bool:
        until = self._store.grant_until(client)
        return until is not None and until > self._now()

    def open(self, *, client: str, exhausted: tuple[str, ...], candidate: str, cost: float) -> PendingApproval:
        """The client's pending approval (created when there is none)."""
        for approval in self.pending.values():
            if approval.client == client:
                return approval
        approval = PendingApproval(id=f"ap-{next(_ids)}", client=client, exhausted=exhausted, candidate=candidate,
                                   estimated_cost_usd=cost, created_at=self._now())
        self.pending[approval.id] = approval
        return approval

    def decide(self, approval_id: str, decision: Literal["once", "deny"] | float) -> PendingApproval:
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
            raise ValueError(f"decision must be 'once', 'deny' or a duration in seconds (got {decision!r})")
        approval.event.set()
        return approval

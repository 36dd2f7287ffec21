"""Approvals of paid fallback: pending ones, the decisions on them, and what a decision leaves in
the store — a client's grant (listed and revoked with `grants()` / `revoke()`) or an "approve
once". See `consent.py` for when a job asks.

Pending approvals live in the state store, so every process sharing it — the workers of one
`lanes serve --workers N`, the job processes on the host, the hosts on one Redis — lists every
pending approval and may decide any of them (once: the store's decision is atomic). A process whose
jobs wait on an approval decided elsewhere applies the decision at its next sync (within half a
second). "Once" is kept in the store with the decision, in the same atomic step, and names the
request approved (its fingerprint), the model and the worst case approved: exactly one request
consumes it (`claim_once`, atomic across processes) — the first of the jobs waiting on it, wherever
they wait, or the client's first matching retry. A store that can not be written leaves the
approval in this process only, and its "once" to the first job waiting here.

Approval ids are random (96 bits), so a page can not guess them.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any, Literal, Protocol

import attrs
import trio

from lanes._core.model.clocks import EpochTime
from lanes._core.model.job import Job
from lanes._core.state.approvals import (
    ApprovalRecord,
    Approvals,
    OnceClaim,
    OnceConsent,
    once_of,
)
from lanes._core.state.backend import STORE_ERRORS, Backend, call
from lanes._core.state.grants import Grants

Decision = Literal["once", "granted", "deny"]
_DECISIONS: dict[str, Decision] = {"once": "once", "granted": "granted", "deny": "deny"}
GRANT_PREFIX = "grant-"  # a grant's id is this and its client's name (one grant per client)


@attrs.define(kw_only=True)
class PendingApproval:
    id: str
    client: str
    fingerprint: str  # the request it is for
    exhausted: tuple[str, ...]  # the free candidates that were held back or failed
    candidate: str  # the paid "lane/model" that will serve if approved
    estimated_cost_usd: float  # its worst case, within what is left of today's ceiling
    created_at: float  # wall-clock epoch seconds
    expires_at: float  # trio clock: the last deadline of the jobs asking for it
    waiting: int = 0  # jobs waiting on it now
    event: trio.Event = attrs.field(factory=trio.Event)
    decision: Decision | None = None
    stored: bool = False  # in the store: other processes list it, and may decide it first
    once_here: bool = False  # its "once", kept in this process only (the store failed the decision)

    async def wait(self, until: float) -> None:
        """Wait for a decision until `until` (trio clock), counted among the jobs waiting on it."""
        self.waiting += 1
        try:
            with trio.move_on_at(until):
                await self.event.wait()
        finally:
            self.waiting -= 1


class ApprovalStore(Backend, Approvals, Grants, Protocol):
    """What approvals need of the state store: approvals, onces and grants, and how a call
    reaches it."""


class PendingApprovals:
    """This process's approvals of paid fallback, over the store's: pending ones, decisions,
    grants and onces."""

    def __init__(
        self, store: ApprovalStore, now_wall: Callable[[], EpochTime], *, once_ttl_s: float
    ) -> None:
        self._store = store
        self._now = now_wall
        self._once_ttl_s = once_ttl_s  # how long an unused "approve once" is kept for the retry
        self._pending: dict[str, PendingApproval] = {}  # this process's, jobs waiting or not
        self._shared: dict[str, ApprovalRecord] = {}  # the store's undecided ones, last we looked

    def pending(self) -> list[PendingApproval]:
        """The approvals waiting for a decision, this process's and (as of the last look at the
        store) the other processes' — those whose jobs' deadlines passed are dropped."""
        now = trio.current_time()
        for approval_id in [
            a.id for a in self._pending.values() if a.expires_at <= now and not a.waiting
        ]:
            del self._pending[approval_id]
        elsewhere = [
            self._adopt(record)
            for approval_id, record in self._shared.items()
            if approval_id not in self._pending and record.expires_at > self._now()
        ]
        return [*self._pending.values(), *elsewhere]

    def _adopt(self, record: ApprovalRecord) -> PendingApproval:
        """Another process's approval, as this one shows it (and waits on it, when asked)."""
        return PendingApproval(
            **_shared_fields(record),
            expires_at=trio.current_time() + (record.expires_at - self._now()),
            stored=True,
        )

    async def refresh(self) -> None:
        """Look at the store's approvals now (the sync looks every half second)."""
        try:
            records = await call(self._store, self._store.approvals, self._now())
        except STORE_ERRORS:
            return  # this process's own list stands
        self.take(records)

    def take(self, records: list[ApprovalRecord]) -> None:
        """The store's approvals: keep the undecided ones for `pending()`, and apply the decisions
        made elsewhere to this process's waiting jobs (a "once" is then theirs to take, from the
        store, one job only)."""
        self._shared = {r.id: r for r in records if r.decision is None}
        for record in records:
            approval = self._pending.get(record.id)
            decision = _DECISIONS.get(record.decision or "")
            if decision is None or approval is None:
                continue
            approval.decision = decision
            del self._pending[record.id]
            approval.event.set()

    def granted(self, client: str) -> bool:
        until = self._store.grant_until(client)
        return until is not None and until > self._now()

    async def open(
        self,
        *,
        job: Job,
        exhausted: tuple[str, ...],
        candidate: str,
        cost: float,
        deadline_at: float,
    ) -> PendingApproval:
        """The pending approval this request asks for — the client's one for the very same request
        (the one its `X-Lanes-Approval` names first), else a new one — written to the store, so
        that every process sharing it lists it and may decide it. A request never joins an
        approval asked for another request."""
        fingerprint = job.request_fingerprint()
        mine = [
            a for a in self.pending() if a.client == job.client and a.fingerprint == fingerprint
        ]
        approval = next((a for a in mine if a.id == job.approval), mine[0] if mine else None)
        if approval is None:
            approval = PendingApproval(
                id=f"ap-{secrets.token_hex(12)}",
                client=job.client,
                fingerprint=fingerprint,
                exhausted=exhausted,
                candidate=candidate,
                estimated_cost_usd=cost,
                created_at=self._now(),
                expires_at=deadline_at,
            )
        self._pending[approval.id] = approval  # ours to wait on (another process's, adopted)
        approval.expires_at = max(approval.expires_at, deadline_at)
        record = _record(approval, self._now())
        try:
            await call(self._store, self._store.put_approval, record, self._now())
        except STORE_ERRORS:
            return approval  # listed and decided in this process only, until the store is back
        approval.stored = True
        return approval

    async def take_once(
        self, job: Job, candidate: str, cost: float, approval: str | None = None
    ) -> bool:
        """Consume an "approve once" of `job`'s client for this very request (its fingerprint) on
        `candidate`, approved for a worst case of at least `cost` USD — `approval`'s (else the one
        the job names) first; True when there was one. Atomic across processes; a store that can
        not answer means no."""
        try:
            taken = await call(
                self._store,
                self._store.claim_once,
                OnceClaim(
                    client=job.client,
                    candidate=candidate,
                    fingerprint=job.request_fingerprint(),
                    cost=cost,
                    approval=approval or job.approval,
                    now=self._now(),
                ),
            )
        except STORE_ERRORS:  # a store that can not answer consents to nothing
            return False
        return taken is not None

    async def use_once(
        self, approval: PendingApproval, job: Job, candidate: str, cost: float
    ) -> bool:
        """A job that waited on `approval`, decided "once": True for the one job that consumes it
        (here, or in the store), False for every other."""
        if approval.once_here and cost <= approval.estimated_cost_usd + 1e-12:
            approval.once_here = False
            return True
        return await self.take_once(job, candidate, cost, approval.id)

    async def kept_once(self, approval_id: str, client: str) -> OnceConsent | None:
        """The unused "approve once" of `client` by that id, if the store (reachable) keeps it."""
        try:
            onces = await call(self._store, self._store.onces, self._now())
        except STORE_ERRORS:
            return None
        return next((o for o in onces if o.id == approval_id and o.client == client), None)

    async def decide(
        self, approval_id: str, decision: Literal["once", "deny"] | float
    ) -> PendingApproval:
        """Decide: "once", "deny", or a duration in seconds that grants the client until then.

        Any process sharing the store may decide any pending approval; the store keeps the first
        decision. Raises KeyError for an unknown (or already decided, or expired) approval id,
        ValueError for a decision that is none of these.
        """
        word = _word(decision)
        self.pending()  # drops what expired
        approval = self._pending.get(approval_id)
        now = self._now()
        once_until = now + self._once_ttl_s  # how long an unused "once" is kept (if "once")
        try:
            decided = await call(
                self._store, self._store.decide_approval, approval_id, word, now, once_until
            )
        except STORE_ERRORS:  # this process's own approvals are still decided here
            if approval is None or (word == "once" and not approval.waiting):
                raise  # no job here could use it, and the store can not keep it
            decided, approval.once_here = None, word == "once"
        else:
            if decided is None and (approval is None or approval.stored):
                raise KeyError(approval_id)  # unknown, expired, or decided by another process
            if decided is None and word == "once":  # the store never had it: keep it there now
                assert approval is not None
                await call(
                    self._store, self._store.put_once, once_of(_record(approval, now), once_until)
                )
        if approval is None:
            assert decided is not None
            approval = self._adopt(decided)  # another process's: its jobs learn at their sync
        self._shared.pop(approval_id, None)
        if word == "granted":
            await call(
                self._store, self._store.put_grant, approval.client, now + float(decision), now
            )
        approval.decision = word
        self._pending.pop(approval.id, None)
        approval.event.set()
        return approval

    async def grants(self) -> list[dict[str, Any]]:
        """Every consent in force: client grants (`grant-<client>`) and unused "approve once"s."""
        now = self._now()
        grants = sorted(self._store.grants(now).items())
        onces = sorted(await call(self._store, self._store.onces, now), key=lambda o: o.until)
        return [
            *(
                dict(id=GRANT_PREFIX + c, kind="duration", client=c, until=u, candidate=None)
                for c, u in grants
            ),
            *(
                dict(id=o.id, kind="once", client=o.client, until=o.until, candidate=o.candidate)
                for o in onces
            ),
        ]

    async def revoke(self, grant_id: str) -> bool:
        """Revoke a grant (`grant-<client>`) or an unused "approve once"; False for no match."""
        now = self._now()
        if grant_id.startswith(GRANT_PREFIX):
            client = grant_id.removeprefix(GRANT_PREFIX)
            if client not in self._store.grants(now):
                return False
            await call(self._store, self._store.put_grant, client, 0.0, now)
            return True
        return bool(await call(self._store, self._store.drop_once, grant_id))


def _shared_fields(approval: ApprovalRecord | PendingApproval) -> dict[str, Any]:
    """What the store keeps of an approval and a process shows of it, but its expiry (kept on
    the wall clock there, on trio's clock here)."""
    names = ("id", "client", "fingerprint", "exhausted", "candidate", "estimated_cost_usd")
    return {name: getattr(approval, name) for name in (*names, "created_at")}


def _record(approval: PendingApproval, now_wall: float) -> ApprovalRecord:
    """A process's approval as the store keeps it (its expiry moved to the wall clock)."""
    return ApprovalRecord(
        **_shared_fields(approval),
        expires_at=now_wall + (approval.expires_at - trio.current_time()),
    )


def _word(decision: Literal["once", "deny"] | float) -> Decision:
    """The decision as the store keeps it; ValueError for one that is none of these."""
    if isinstance(decision, int | float) and not isinstance(decision, bool):
        if not 0 < decision <= 366 * 86400:
            raise ValueError(
                f"an approval duration must be > 0 s and at most a year (got {decision})"
            )
        return "granted"
    if decision in ("once", "deny"):
        return decision
    raise ValueError(f"decision must be 'once', 'deny' or a duration in seconds (got {decision!r})")

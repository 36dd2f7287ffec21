"""Approvals of paid fallback: pending ones, the decisions on them, and what a decision leaves in
the store — a client's grant (listed and revoked with `grants()` / `revoke()`) or an unused
"approve once" kept for the client's retry. See `consent.py` for when a job asks.

Pending approvals live in the state store, so every process sharing it — the workers of one
`lanes serve --workers N`, the job processes on the host, the hosts on one Redis — lists every
pending approval and may decide any of them (once: the store's decision is atomic). A process whose
jobs wait on an approval decided elsewhere applies the decision at its next sync (within half a
second): its waiting jobs go through, or are refused. "Once" decided where no job waits is kept for
the client's retry; a process whose jobs were still waiting on it withdraws that kept one when it
lets them through. A store that can not be written leaves the approval in this process only.

Approval ids are random (96 bits), so a page can not guess them.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any, Literal

import attrs
import trio

from lanes._core.clocks import EpochTime
from lanes._core.job import Job
from lanes._core.state.store import STORE_ERRORS, ApprovalRecord, OnceConsent, Store, call

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


class Approvals:
    def __init__(
        self, store: Store, now_wall: Callable[[], EpochTime], *, once_ttl_s: float
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

    def take(self, records: list[ApprovalRecord]) -> list[str]:
        """The store's approvals: keep the undecided ones for `pending()`, and apply the decisions
        made elsewhere to this process's waiting jobs. Returns the "once" approvals whose waiting
        jobs go through here, so that the "once" kept for a retry is withdrawn."""
        self._shared = {r.id: r for r in records if r.decision is None}
        used = []
        for record in records:
            approval = self._pending.get(record.id)
            decision = _DECISIONS.get(record.decision or "")
            if decision is None or approval is None:
                continue
            approval.decision = decision
            del self._pending[record.id]
            approval.event.set()
            if record.decision == "once" and approval.waiting:
                used.append(record.id)
        return used

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
        """The pending approval this request asks for — the one its `X-Lanes-Approval` names, else
        the client's one for the same request, else a new one — written to the store, so that
        every process sharing it lists it and may decide it."""
        fingerprint = job.request_fingerprint()
        pending = self.pending()
        approval = next(
            (a for a in pending if a.id == job.approval and a.client == job.client), None
        )
        approval = approval or next(
            (a for a in pending if a.client == job.client and a.fingerprint == fingerprint), None
        )
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
        record = ApprovalRecord(
            **_shared_fields(approval),
            expires_at=self._now() + (approval.expires_at - trio.current_time()),
        )
        try:
            await call(self._store, self._store.put_approval, record, self._now())
        except STORE_ERRORS:
            return approval  # listed and decided in this process only, until the store is back
        approval.stored = True
        return approval

    async def take_once(self, job: Job, candidate: str) -> bool:
        """Consume an "approve once" kept for this request and `candidate` (by approval id or
        fingerprint); True when there was one. A store that can not answer means no."""
        try:
            taken = await call(
                self._store,
                self._store.take_once,
                client=job.client,
                candidate=candidate,
                fingerprint=job.request_fingerprint(),
                approval=job.approval,
                now=self._now(),
            )
        except STORE_ERRORS:  # a store that can not answer consents to nothing
            return False
        return taken is not None

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
        try:
            decided = await call(
                self._store, self._store.decide_approval, approval_id, word, self._now()
            )
        except STORE_ERRORS:  # this process's own approvals are still decided here
            if approval is None:
                raise
            decided = None
        else:
            if decided is None and (approval is None or approval.stored):
                raise KeyError(approval_id)  # unknown, expired, or decided by another process
        if approval is None:
            assert decided is not None
            approval = self._adopt(decided)  # another process's: its jobs learn at their sync
        self._shared.pop(approval_id, None)
        if word == "granted":
            now = self._now()
            await call(
                self._store, self._store.put_grant, approval.client, now + float(decision), now
            )
            approval.decision = "granted"
        else:
            approval.decision = word
            if word == "once" and not approval.waiting:  # the client will retry: keep it for then
                await call(
                    self._store,
                    self._store.put_once,
                    OnceConsent(
                        id=approval.id,
                        client=approval.client,
                        fingerprint=approval.fingerprint,
                        candidate=approval.candidate,
                        until=self._now() + self._once_ttl_s,
                    ),
                )
        self._pending.pop(approval.id, None)
        approval.event.set()
        return approval

    async def grants(self) -> list[dict[str, Any]]:
        """Every consent in force: client grants (`grant-<client>`) and unused "approve once"s."""
        now = self._now()
        out: list[dict[str, Any]] = [
            {
                "id": f"{GRANT_PREFIX}{client}",
                "kind": "duration",
                "client": client,
                "until": until,
                "candidate": None,
            }
            for client, until in sorted(self._store.grants(now).items())
        ]
        onces = await call(self._store, self._store.onces, now)
        out += [
            {
                "id": o.id,
                "kind": "once",
                "client": o.client,
                "until": o.until,
                "candidate": o.candidate,
            }
            for o in sorted(onces, key=lambda o: o.until)
        ]
        return out

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

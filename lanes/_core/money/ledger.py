"""The ledger: global attempt governors per minute and per day, and the hard daily paid ceiling.

Every upstream attempt counts — primary, retry and paid — so a retry is never "free load". The
attempt counts live in the FreeTierManager's counters (scope `governor`), shared with the other
processes on the host through the store. The paid ceiling is a ledger in the store: each paid
attempt reserves its own worst case before it is sent (one atomic transaction, across processes),
and settles to the real cost after. A store that can not record the reservation fails closed: no
paid attempt.

A credit lane's attempts are held the same way against the credits left (`hold_credit`): each
holds its own worst case while in flight — in this process; other processes see what it spent at
the next sync — and settles to its real cost.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Protocol

import attrs

from lanes._core.config.schema import ClientConfig
from lanes._core.freetier.manager import FreeTierManager
from lanes._core.freetier.windows import WindowName, window_end, window_id
from lanes._core.model.candidates import Candidate
from lanes._core.model.clocks import EpochTime
from lanes._core.model.errors import GovernorExhausted, PaidBudgetExhausted
from lanes._core.money.quote import Quote
from lanes._core.policy.ceiling import ceiling_in_force, fits, room
from lanes._core.policy.policy import PolicyConfig
from lanes._core.policy.spend import Unbounded
from lanes._core.state.backend import STORE_ERRORS, Backend, ClockRefused, call
from lanes._core.state.clock import StoreClock
from lanes._core.state.paid import PaidAsk, PaidLedger

log = logging.getLogger("lanes")
SCOPE = "governor"


@attrs.frozen(kw_only=True)
class Reservation:
    """One paid attempt's hold on today's budget: its own id, never shared with another attempt."""

    id: str
    amount_usd: float
    credit: str | None = None  # a hold on this lane's credits, not on the paid ceiling


class LedgerStore(Backend, PaidLedger, Protocol):
    """What the ledger needs of the state store: the paid ledger, and how a call reaches it."""


class Ledger:
    def __init__(
        self,
        policy: Callable[[], PolicyConfig],
        manager: FreeTierManager,
        store: LedgerStore,
        now_wall: Callable[[], EpochTime],
        clock: StoreClock,
        clients: Mapping[str, ClientConfig] | None = None,
    ) -> None:
        """`policy` is the policy in force (its ceiling and governors), read at every use."""
        self._policy = policy
        self._clients = dict(clients or {})  # clients' own ceilings and governors
        self._manager = manager
        self._store = store
        self._now = now_wall
        self._day = clock.trusted  # the ledger's clock: the store's
        self._clock = clock
        self._ledger_failing = False  # one log line per outage, not one per refused job

    def take_attempt(self, client: str = "anonymous", *, shared: bool = True) -> None:
        """Count one upstream attempt (globally unless it is not `shared` — a client's own key —,
        and for `client` when it has governors of its own), or raise `GovernorExhausted` when a
        cap is reached."""
        now = self._now()
        own = self._clients.get(client)
        caps: list[tuple[str, str, int | None, WindowName]] = []
        if shared:
            caps += [
                (SCOPE, "attempt governor", self._policy().attempts_per_minute, "minute"),
                (SCOPE, "attempt governor", self._policy().attempts_per_day, "day"),
            ]
        if own is not None:
            scope, who = f"{SCOPE}:{client}", f"client {client}'s attempt governor"
            caps += [
                (scope, who, own.attempts_per_minute, "minute"),
                (scope, who, own.attempts_per_day, "day"),
            ]
        for scope, who, cap, window in caps:
            if cap and self._manager.used(scope, "requests", window, now) >= cap:
                wait = window_end(window, now) - now
                raise GovernorExhausted(
                    f"{who}: {cap} attempts per {window} used; next in {wait:.0f}s",
                    retry_after_s=wait,
                )
        for scope in {scope for scope, _, cap, _ in caps if cap}:
            self._manager.count_request(scope, now)

    async def reserve(self, quote: Quote) -> Reservation:
        """Reserve the worst case of one paid attempt (its `quote`) under today's ceiling, or
        raise `PaidBudgetExhausted`."""
        candidate, job, amount = quote.candidate, quote.job, quote.worst_usd
        if amount is None or isinstance(amount, Unbounded):  # the gate skips these before
            raise PaidBudgetExhausted(
                f"{candidate.key}: {amount or 'not held'}; it can not be held to the ceiling"
            )
        closed = self.closed()
        if closed is not None:
            raise closed
        now = self._day()
        try:
            reservation = await call(
                self._store,
                self._store.reserve,
                PaidAsk(
                    day=window_id("day", now),
                    amount=amount,
                    ceiling=self._policy().paid_ceiling_usd_per_day,
                    lane=candidate.lane,
                    model=candidate.model,
                    job=job.id,
                    cohort=job.cohort,
                    client=job.client,
                    client_ceiling=self.client_ceiling(job.client),
                    wall=self._now(),
                    tolerance_s=self._policy().clock_tolerance_s,
                ),
            )
        except ClockRefused as exc:  # the store's own clock said so, at the reservation
            self._clock.observe(exc.skew_s)
            raise self.closed() or PaidBudgetExhausted(str(exc), retry_after_s=5.0) from exc
        except STORE_ERRORS as exc:
            # a shared store's outage is logged by the sync
            if not self._ledger_failing and not self._store.shared:
                log.warning(
                    "paid ledger: can not record a reservation (%s); paid fallback closed", exc
                )
            self._ledger_failing = True
            raise PaidBudgetExhausted(
                "the paid ledger can not be written; paid fallback is closed", retry_after_s=5.0
            ) from exc
        if self._ledger_failing and not self._store.shared:
            log.warning("paid ledger: writable again; paid fallback open")
        self._ledger_failing = False
        if reservation is None:
            raise self.refusal(amount, job.client)
        return Reservation(id=reservation, amount_usd=amount)

    def refused(self, amount: float, client: str = "anonymous") -> PaidBudgetExhausted | None:
        """Why a paid attempt whose worst case is `amount` USD may not be reserved now, as this
        process last knew today's spend: the ledger is closed, or it is more than is left of the
        ceiling (`client`'s own too). None: it may be asked for."""
        refusal = self.closed()
        if refusal is None and not fits(amount, self.left_today(client)):
            refusal = self.refusal(amount, client)
        return refusal

    def closed(self) -> PaidBudgetExhausted | None:
        """The refusal of every paid attempt while this process's wall disagrees with the state
        store's clock (None when it agrees)."""
        why = self._clock.refusal()
        return PaidBudgetExhausted(why, retry_after_s=5.0) if why else None

    def metered(self, candidate: Candidate) -> bool:
        """Does an attempt on `candidate` spend credits that are known, so it must fit in them?"""
        return candidate.tier == "free" and self._manager.credit_metered(
            candidate.lane, candidate.model, self._now()
        )

    def hold_credit(self, quote: Quote) -> Reservation | str | None:
        """Hold the worst case of one credit attempt (its `quote`) against the lane's credits
        left; or say why it can not be sent: no bound, or more than is left. None: the attempt
        spends no credits that are known (not a credit lane, a free model, no budget or balance:
        its quote is not held) or it is paid (reserved under the ceiling instead)."""
        candidate, amount = quote.candidate, quote.worst_usd
        if not quote.held or quote.paid:
            return None
        if amount is None or isinstance(amount, Unbounded):
            return f"worst case can not be bounded against its credits: {amount}"
        refused = self._manager.hold_credit(candidate.lane, amount, self._now())
        if refused is not None:
            return refused
        return Reservation(id="", amount_usd=amount, credit=candidate.lane)

    def settle(self, reservation: Reservation, cost: float) -> None:
        """Replace the reservation by the attempt's real cost, as its validated usage reports it."""
        if reservation.credit is not None:
            self._manager.settle_credit(
                reservation.credit, reservation.amount_usd, max(cost, 0.0), self._now()
            )
            return
        try:
            self._store.settle_paid(reservation.id, max(cost, 0.0))
        except STORE_ERRORS as exc:  # the reservation stays counted in full: never an under-count
            log.warning(
                "paid ledger: can not settle a reservation (%s); it stays counted in full", exc
            )

    def client_ceiling(self, client: str) -> float | None:
        own = self._clients.get(client)
        return None if own is None else own.paid_ceiling_usd_per_day

    def ceiling(self, client: str | None = None) -> float:
        """The paid ceiling in force today (USD): the policy's, or the lower of it and `client`'s
        own."""
        own = None if client is None else self.client_ceiling(client)
        return ceiling_in_force(self._policy().paid_ceiling_usd_per_day, own)

    def refusal(self, amount: float, client: str = "anonymous") -> PaidBudgetExhausted:
        """The error for a paid attempt whose worst case (`amount` USD) would cross today's ceiling
        (or `client`'s own); it says when the ceilings reset (UTC midnight)."""
        now = self._day()
        ceiling, whose = self.ceiling(), "paid ceiling"
        own = self.client_ceiling(client)
        if own is not None and self.left_today(client) < self.left_today():
            ceiling, whose = own, f"client {client}'s paid ceiling"
        return PaidBudgetExhausted(
            f"{whose} ${ceiling:.2f}/day would be crossed by ${amount:.6f}",
            retry_after_s=window_end("day", now) - now,
        )

    def left_today(self, client: str | None = None) -> float:
        """USD left under today's paid ceiling — and `client`'s own, when it has one — as this
        process last knew it (never below 0)."""
        day = window_id("day", self._day())
        own = None if client is None else self.client_ceiling(client)
        left = room(
            spent=self._store.paid_spent(day),
            ceiling=self.ceiling(),
            client_spent=0.0 if own is None else self._store.paid_spent(day, client),
            client_ceiling=own,
        )
        return max(0.0, left)

    def spent_today(self, client: str | None = None) -> float:
        """USD spent (or held) today under the ceiling: every client's, or `client`'s own."""
        return self._store.paid_spent(window_id("day", self._day()), client)

    def day_ends_at(self) -> float:
        """When the ledger's day ends: the next UTC midnight on the store's clock (epoch s)."""
        return window_end("day", self._day())

"""The paid gate: the one door between an attempt and money — consent, the hold, the settlement.

```python
quotes = Quotes(record.job)                            # one walk of the job
quote = paid.quote(quotes, candidate)                  # worked out once per candidate
permit = await paid.may_pay(record, quote, pinned=False, lane_min_s=2.0)   # paid only
...                                                    # the breakers admit the attempt
hold = await paid.hold(record, quote, permit, shared=True)   # governors, credits, the ceiling
...                                                    # the request is sent
cost = paid.settle(hold, "ok", status=200, category="", usage=usage, spend_credits=True)
```

`may_pay` is asked before every paid attempt (retries too: a grant may be revoked). It refuses a
quote with no bound and one the ceiling can not take now (so an approval is never asked for more
than could be spent), then asks consent (`consent.py`: off, ask or allow; grants, "approve once";
naming one paid model is consent). Its `PaidPermit` is the only way to a paid hold.

`hold` counts the attempt against the governors (every attempt) and holds its worst case: a paid
one's reserved under today's ceiling in the store, a credit one's against its lane's credits
(`ledger.py`). It holds nothing on a refusal. `settle` replaces the hold by what the attempt could
be billed (`quote.settled_cost`); `release` gives back the hold of a request never sent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import trio

from lanes._core.freetier.manager import FreeTierManager
from lanes._core.freetier.prices import usage_cost
from lanes._core.model.candidates import Candidate, Outcome
from lanes._core.model.clocks import EpochTime
from lanes._core.model.errors import GovernorExhausted
from lanes._core.model.record import JobRecord
from lanes._core.model.statuses import BATCH_MIN_PAID_S, BATCH_PAYS, NEVER_PAYS
from lanes._core.money.consent import Consent
from lanes._core.money.ledger import Ledger, Reservation
from lanes._core.money.quote import Quote, Quotes, settled_cost
from lanes._core.policy.policy import PolicyConfig
from lanes._core.policy.spend import Unbounded

log = logging.getLogger("lanes")


@attrs.frozen(kw_only=True)
class PaidPermit:
    """Consent to pay for one quote: what `may_pay` gives and a paid `hold` requires."""

    quote: Quote
    by: str  # "pinned" (the job named this paid model), or how consent was given


@attrs.frozen(kw_only=True)
class Hold:
    """What an attempt holds while it is in flight: its quote, and the money it holds (None: it
    spends nothing that is known — a free or local model, a client's own key)."""

    quote: Quote
    reservation: Reservation | None


class PaidGate:
    """Quotes, consent, holds and settlements, over one ledger and one consent."""

    def __init__(
        self,
        ledger: Ledger,
        consent: Consent,
        manager: FreeTierManager,
        now_wall: Callable[[], EpochTime],
        policy: Callable[[], PolicyConfig],
    ) -> None:
        """`policy` is the policy in force, read at every quote and ask."""
        self._ledger = ledger
        self._consent = consent
        self._policy = policy
        self._manager = manager
        self._now = now_wall

    def quote(self, quotes: Quotes, candidate: Candidate) -> Quote:
        """`candidate`'s quote for the job of `quotes` (worked out on first ask, then kept)."""
        metered = self._ledger.metered(candidate)
        return quotes.of(candidate, self._policy(), metered=metered)

    async def may_pay(
        self, record: JobRecord, quote: Quote, *, pinned: bool, lane_min_s: float
    ) -> PaidPermit | None:
        """A `PaidPermit` when `record`'s job may pay for `quote` now: its worst case is bounded,
        fits what is left of today's ceiling, and consent holds (`pinned`: the job named this paid
        model). None after recording why not. Raises what `Consent.ask` raises (an approval asked
        for and not given, a denial)."""
        candidate, estimate = quote.candidate, quote.worst_usd
        if record.job.free_only:
            record.skip(candidate, NEVER_PAYS)
            return None
        if estimate is None or isinstance(estimate, Unbounded):
            record.skip(candidate, f"worst case can not be bounded: {estimate or 'not held'}")
            return None
        budget = self._within_budget(record, estimate)
        if budget is not None:
            record.skip(candidate, budget)
            return None
        refusal = self._ledger.refused(estimate, record.job.client)
        if refusal is not None:
            record.refused_by_ceiling(refusal)
            record.skip(candidate, str(refusal))
            return None
        if pinned:
            return PaidPermit(quote=quote, by="pinned")
        min_time_s = max(lane_min_s, self._policy().approval_min_s)
        if not await self._consent.ask(record, candidate, estimate=estimate, min_time_s=min_time_s):
            return None
        return PaidPermit(quote=quote, by=record.approval or "allow")

    def _within_budget(self, record: JobRecord, estimate: float) -> str | None:
        """Why a batch item on its batch's budget (`Job.paid_cap_usd`) may not pay `estimate`,
        or None (also for any other job): it pays only under consent `allow` — no approval is
        asked for work that can wait, and naming a paid model does not stand for consent — and
        only within what is left of its budget."""
        cap = record.job.paid_cap_usd
        if cap is None:
            return None
        if self._policy().free_tier_fallback != "allow":
            return f"{BATCH_PAYS} only under free_tier_fallback = allow"
        if record.deadline_at - trio.current_time() < BATCH_MIN_PAID_S:  # each attempt, retries too
            return f"{BATCH_PAYS} only with {BATCH_MIN_PAID_S:g} s of its window left"
        spent = sum(a.cost_usd for a in record.attempts)  # its earlier attempts count too
        if not spent + estimate <= cap:
            return (
                f"{BATCH_PAYS}: its worst case ${estimate:.6f} and the ${spent:.6f} it spent "
                f"are over the ${cap:.6f} left"
            )
        return None

    async def hold(
        self, record: JobRecord, quote: Quote, permit: PaidPermit | None, *, shared: bool
    ) -> Hold | str:
        """Count one attempt on `quote` against the governors (globally when `shared`: not a
        client's own key) and hold its worst case; or say why it can not be sent (its credits).
        A paid quote needs its `permit`. Raises `GovernorExhausted` or `PaidBudgetExhausted`, with
        nothing held."""
        if quote.paid and (permit is None or permit.quote is not quote):
            return "paid fallback without consent for this request"
        held = self._ledger.hold_credit(quote)  # None: it spends no known credits
        if isinstance(held, str):
            return held
        try:
            self._ledger.take_attempt(record.job.client, shared=shared)
        except GovernorExhausted:
            if held is not None:
                self._ledger.settle(held, 0.0)
            raise
        if quote.paid:
            record.paying_from(self._ledger.spent_today())
            held = await self._ledger.reserve(quote)
        return Hold(quote=quote, reservation=held)

    def settle(
        self,
        hold: Hold,
        outcome: Outcome,
        *,
        status: int | None,
        category: str,
        usage: Mapping[str, Any] | None,
        spend_credits: bool,
    ) -> float:
        """Replace `hold` by what its attempt, ended so, could be billed; return its paid spend
        (USD; 0 for credits). Every credit charge is settled here: a held credit attempt at what
        it cost, an unheld one (its credits not known) at what its usage reports, and a paid model
        of a credit lane spends its credits as well as the ceiling — when `spend_credits` (the
        lane's shared credits, not a client's own key)."""
        reservation = hold.reservation
        candidate = hold.quote.candidate
        if reservation is None:
            if spend_credits and outcome == "ok":
                cost = usage_cost(
                    usage, candidate.input_usd_per_mtok, candidate.output_usd_per_mtok
                )
                self._manager.settle_credit(candidate.lane, 0.0, cost or 0.0, self._now())
            return 0.0
        cost, believed = settled_cost(
            hold.quote,
            reservation.amount_usd,
            outcome,
            status=status,
            category=category,
            usage=usage,
        )
        if not believed:
            log.info(
                "lane %s: %s reported no usable usage (not sane, or not adding up); "
                "settled at the reservation",
                candidate.lane,
                candidate.model,
            )
        self._ledger.settle(reservation, cost)
        if reservation.credit is not None:
            return 0.0  # credits, not paid spend
        if spend_credits:  # what the ledger kept, sane usage or not
            self._manager.settle_credit(candidate.lane, 0.0, cost, self._now())
        return cost

    def release(self, hold: Hold) -> None:
        """Give back what `hold` holds: its request was never sent."""
        if hold.reservation is not None:
            self._ledger.settle(hold.reservation, 0.0)

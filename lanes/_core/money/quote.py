"""What an attempt on a candidate sends and may cost, worked out once; and what it settles at. Pure.

A `Quote` is the job as an attempt on one candidate sends it (`spend.as_sent`) and, when that
attempt is held to its worst case — paid, or spending the known credits of a credit lane — the worst
case itself (`spend.worst_case`). One walk of a job keeps its quotes in `Quotes`, so each is
worked out once per candidate, however often the candidate is tried: the paid gate asks consent and
reserves with it, and the attempt sends the job it holds.

`settled_cost` is the other end: what the ledger keeps for a held attempt once it ended.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from lanes._core.freetier.prices import settled_usd
from lanes._core.model.candidates import Candidate, Outcome
from lanes._core.model.job import Job
from lanes._core.model.record import unbilled
from lanes._core.policy.policy import PolicyConfig
from lanes._core.policy.spend import Unbounded, as_sent, worst_case

# lanes: pure


@attrs.frozen(kw_only=True)
class Quote:
    """One candidate's price for one job: the job as sent there, and, when the attempt is `held`
    to it, its worst case in USD (an `Unbounded` when it has none: it is not sent)."""

    candidate: Candidate
    job: Job  # as an attempt on `candidate` sends it
    held: bool  # held to its worst case: paid, or spending known credits
    worst_usd: float | Unbounded | None  # None when not held

    @property
    def paid(self) -> bool:
        return self.candidate.tier == "paid"


def quote(candidate: Candidate, job: Job, policy: PolicyConfig, *, metered: bool = False) -> Quote:
    """`job` as an attempt on `candidate` sends it and, for a paid one or one spending known
    credits (`metered`), its worst case: one output cap in the lane's dialect, never above
    `policy.paid_max_tokens`; not paid, none of the lane's billing switches."""
    held = candidate.tier == "paid" or metered
    sent = as_sent(job, candidate, paid_max_tokens=policy.paid_max_tokens, capped=held)
    return Quote(
        candidate=candidate,
        job=sent,
        held=held,
        worst_usd=worst_case(candidate, sent) if held else None,
    )


class Quotes:
    """The quotes of one walk of `job`: each candidate's worked out once, and again only when what
    it is held to changes (a credit lane's balance became known between two attempts)."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self._known: dict[tuple[str, bool], Quote] = {}

    def of(self, candidate: Candidate, policy: PolicyConfig, *, metered: bool = False) -> Quote:
        key = (candidate.key, candidate.tier == "paid" or metered)
        found = self._known.get(key)
        if found is None or found.candidate != candidate:  # a catalog may reprice a key
            found = self._known[key] = quote(candidate, self.job, policy, metered=metered)
        return found


def settled_cost(
    quote: Quote,
    reserved_usd: float,
    outcome: Outcome,
    *,
    status: int | None,
    category: str,
    usage: Mapping[str, Any] | None,
) -> tuple[float, bool]:
    """(USD, believed): what the ledger keeps for an attempt held at `reserved_usd` — the cost its
    usage reports when that is sane and adds up (`prices.settled_usd`); nothing for a refusal that
    proves no work was done or a request that never reached the upstream (`record.unbilled`);
    otherwise (a 5xx or 408 from a gateway whose model may have run, usage not to be believed,
    cut, cancelled) the whole reservation. `believed` is False only for an answer whose usage was
    not believed."""
    if outcome == "ok":
        candidate = quote.candidate
        return settled_usd(
            usage,
            candidate.input_usd_per_mtok,
            candidate.output_usd_per_mtok,
            reserved_usd=reserved_usd,
        )
    if unbilled(status, category):
        return 0.0, True
    return reserved_usd, True

"""One ceiling per store: this process's side of the shared terms (see `state/terms.py`).

It announces the terms its config gives at start-up (a reload starts new workers, which announce
theirs), beats every sync, and routes by the store's terms: the stricter of every live host's
(or what an operator set with `lanes ceiling set`). A disagreement is one log line, said again only
when what it says changes. The reservation itself is held to the store's ceiling in the store's
own transaction (or script), so a host that has not seen a stricter announcement yet still can not
spend past it.
"""

from __future__ import annotations

import logging
import os
import platform
from typing import Protocol

import attrs

from lanes._core.policy.policy import FallbackMode, PolicyConfig
from lanes._core.state import terms
from lanes._core.state.backend import Backend, call
from lanes._core.state.beats import SharedTerms
from lanes._core.state.clock import StoreClock

log = logging.getLogger("lanes")
_FALLBACKS: dict[str, FallbackMode] = {"off": "off", "ask": "ask", "allow": "allow"}


def terms_of(policy: PolicyConfig) -> terms.Terms:
    return terms.Terms(
        ceiling_usd=policy.paid_ceiling_usd_per_day,
        consent=terms.consent_of(policy.free_tier_fallback, policy.free_tier_only),
    )


def governed(policy: PolicyConfig, by: terms.Terms) -> PolicyConfig:
    """`policy` under the terms `by`: its ceiling and consent mode replaced, the rest kept."""
    return attrs.evolve(
        policy,
        paid_ceiling_usd_per_day=by.ceiling_usd,
        free_tier_only=by.consent == "free_tier_only",
        free_tier_fallback=_FALLBACKS.get(by.consent, policy.free_tier_fallback),
    )


@attrs.frozen(kw_only=True)
class TermsStatistics:
    configured: terms.Terms  # what this process's config gives
    effective: terms.Terms  # what it routes by
    ceiling_by: str  # who set the effective ceiling (a host's label, or an operator via one)
    consent_by: str
    hosts: tuple[terms.Host, ...]  # every live host (process) sharing the store, at the last beat


class TermsStore(Backend, SharedTerms, Protocol):
    """What the terms need of the state store: the beats and terms, and how a call reaches it."""


class PaidTerms:
    """This process's side of the shared terms, and the owner of the policy in force: the
    configured one, its ceiling and consent governed by the store's terms. The walk, the ledger
    and consent read it (`policy()`); only the beats change it."""

    def __init__(self, policy: PolicyConfig, clock: StoreClock, store: TermsStore) -> None:
        self.label = f"{platform.node()[:48] or 'host'}:{os.getpid()}"
        self._clock = clock
        self._store = store
        self._host = store.host_id
        self._policy = policy  # as configured
        self._in_force = policy  # as the store's terms govern it
        self.configured = terms_of(policy)
        self._fresh = True  # announced anew at the next beat
        self.pulse: terms.Pulse | None = None
        self._said: tuple[terms.Terms, terms.Terms] | None = None

    def policy(self) -> PolicyConfig:
        """The policy routing obeys now: as configured, under the store's terms."""
        return self._in_force

    def beat(self) -> terms.Beat:
        """What this process says at the next sync (may be called from a worker thread)."""
        return terms.Beat(
            host=self._host,
            label=self.label,
            terms=self.configured,
            fresh=self._fresh,
            wall=self._clock.wall(),
            skew_s=self._clock.measure(),
            now=self._clock.trusted(),
        )

    async def round(self) -> None:
        """One beat (the state sync's, every round): say this process's terms and view of the
        clock, measure the store's clock (Redis: its TIME, halfway through the round trip), route
        by the store's terms. Raises what the store raises."""

        def work() -> tuple[terms.Beat, terms.Pulse | None, float]:
            beat = self.beat()
            return beat, self._store.heartbeat(beat), self._clock.wall()

        beat, pulse, after = await call(self._store, work)
        if pulse is not None:  # None: other hosts kept changing the terms; the next round beats
            skew = None if pulse.store_time is None else pulse.store_time - (beat.wall + after) / 2
            self.take(pulse, skew)

    async def set_by_operator(
        self, *, ceiling_usd: float | None = None, consent: terms.ConsentMode | None = None
    ) -> None:
        """An operator's `lanes ceiling set`: kept in the store over every announcement made
        before it, for every host sharing it (each takes it at its next sync; this one now)."""
        now = self._clock.trusted()  # the store stamps it with its own clock when it has one
        operator = terms.Operator(
            ceiling_usd=ceiling_usd,
            ceiling_at=now,
            consent=consent,
            consent_at=now,
            by=self.label,
        )
        await call(self._store, self._store.set_terms, operator)
        log.warning(
            "paid terms: an operator set%s%s for every host sharing the state store",
            "" if ceiling_usd is None else f" the ceiling to ${ceiling_usd:g}/day",
            "" if consent is None else f" consent to {consent}",
        )
        await self.round()

    async def leave(self) -> None:
        """Withdraw this process's announcement (a graceful exit): it holds no one back."""
        await call(self._store, self._store.withdraw)

    def operator(self) -> terms.Operator | None:
        """What an operator set, as this process last saw it (pushed back into a store that lost
        it)."""
        return None if self.pulse is None else self.pulse.operator

    def take(self, pulse: terms.Pulse, skew_s: float | None) -> None:
        """The store answered a beat: route by its terms, say a disagreement once."""
        self._fresh = False
        self.pulse = pulse
        if skew_s is not None:
            self._clock.observe(skew_s)
        self._clock.compare(pulse.others, self._clock.wall())
        effective = self.effective()
        self._in_force = governed(self._policy, effective)
        said = (self.configured, effective)
        if said == self._said:
            return
        if effective != self.configured:
            agreed = pulse.agreed
            assert agreed is not None  # else the effective terms are the configured ones
            log.warning(
                "paid terms: this host is configured with a ceiling of $%g/day and consent %s; "
                "the state store's are $%g (set by %s) and %s (set by %s): using those, the "
                "stricter or an operator's, until `lanes ceiling set` or a reload on every host",
                self.configured.ceiling_usd,
                self.configured.consent,
                effective.ceiling_usd,
                agreed.ceiling_by,
                effective.consent,
                agreed.consent_by,
            )
        elif self._said is not None and self._said[0] != self._said[1]:
            log.warning("paid terms: the state store's terms are this host's configured ones again")
        self._said = said

    def effective(self) -> terms.Terms:
        agreed = None if self.pulse is None else self.pulse.agreed
        return self.configured if agreed is None else agreed.terms

    def statistics(self) -> TermsStatistics:
        agreed = None if self.pulse is None else self.pulse.agreed
        return TermsStatistics(
            configured=self.configured,
            effective=self.effective(),
            ceiling_by=agreed.ceiling_by if agreed else self.label,
            consent_by=agreed.consent_by if agreed else self.label,
            hosts=self.pulse.hosts if self.pulse else (),
        )

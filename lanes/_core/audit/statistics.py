"""`Dispatcher.statistics()`: one frozen snapshot of everything the operations views show.

`/v1/lanes`, `/metrics`, the status page, `lanes status` and the canary read this record instead of
the dispatcher's attributes, so none of them can change routing state by reading it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs
import trio

from lanes._core.audit.journal import Journal
from lanes._core.audit.tally import TallyStatistics
from lanes._core.engine.context import Routing
from lanes._core.engine.gate import Switchboard
from lanes._core.freetier.kinds import CreditBased
from lanes._core.model.candidates import Candidate
from lanes._core.money.approvals import PendingApprovals
from lanes._core.money.ledger import Ledger
from lanes._core.money.terms import PaidTerms, TermsStatistics
from lanes._core.policy.breaker import BreakerStatistics
from lanes._core.policy.pool import Pool
from lanes._core.runtime.tasks import BackgroundStatistics
from lanes._core.state.backend import Backend
from lanes._core.state.clock import ClockStatistics, StoreClock


@attrs.frozen(kw_only=True)
class ModelStatistics:
    model: str
    key: str  # "lane/model"
    tier: str
    # could be sent a request now: not switched off, held back or behind an open breaker
    free_now: bool
    reason: str  # why not ("" when it could)
    breaker: BreakerStatistics
    backoff_s: float
    backoff_reason: str | None
    requests_remaining: float | None  # as the provider last reported (None once its window reset)
    tokens_remaining: float | None
    used_today: int  # requests counted today (UTC), all processes sharing the state
    quarantined: str | None  # why the canary took it out of routing


@attrs.frozen(kw_only=True)
class OtherModels:
    """A lane's models not shown one by one (beyond `[metrics] models_per_lane`), summed up."""

    models: int
    free_now: int  # of them, how many could be sent a request now


@attrs.frozen(kw_only=True)
class LaneStatistics:
    name: str
    provider: str
    kind: str
    off: bool  # switched off at runtime, or a free lane while FREE_LANE=off
    breaker: BreakerStatistics  # the lane-level breaker (provider-wide evidence)
    models: tuple[ModelStatistics, ...]  # at most `models_per_lane`: the most used, config order
    credits_left_usd: float | None
    unreachable: str | None
    other: OtherModels | None = None  # the rest, when the lane has more

    @property
    def free_now(self) -> int:
        """How many of the lane's models could be sent a request now (the other ones too)."""
        return sum(m.free_now for m in self.models) + (self.other.free_now if self.other else 0)


@attrs.frozen(kw_only=True)
class StoreStatistics:
    kind: str
    where: str
    up: bool


@attrs.frozen(kw_only=True)
class Statistics:
    at: float  # wall-clock epoch seconds
    free_lane: bool
    lanes: tuple[LaneStatistics, ...]
    unavailable: Mapping[str, str]  # lanes that did not load, and why
    paid_spent_today_usd: float
    paid_ceiling_usd: float
    fallback: str
    approvals: tuple[Mapping[str, Any], ...]
    recent: tuple[Mapping[str, Any], ...]
    quarantined: Mapping[str, str]
    store: StoreStatistics
    explored: int
    explored_served: int
    tally: TallyStatistics  # jobs, attempts, latency, tokens and cost since this process started
    background: BackgroundStatistics = attrs.field(
        factory=lambda: BackgroundStatistics(tasks=(), dropped={})
    )
    clock: ClockStatistics | None = None  # this wall, checked against the state store's clock
    terms: TermsStatistics | None = None  # the ceiling and consent: configured, and the store's

    def lane(self, name: str) -> LaneStatistics:
        return next(lane for lane in self.lanes if lane.name == name)

    def model(self, key: str) -> ModelStatistics:
        """A model shown one by one (see `Dispatcher.model_statistics` for any model)."""
        lane, _, model = key.partition("/")
        return next(m for m in self.lane(lane).models if m.model == model)


def model_statistics(routing: Routing, switches: Switchboard, c: Candidate) -> ModelStatistics:
    """One candidate's state now: gate, breaker, backoff, quota, usage, quarantine."""
    now, now_wall = trio.current_time(), routing.now_wall()
    manager = routing.manager
    backoff = manager.is_in_backoff(c.lane, c.model, now_wall)
    scope = manager.scope(c.lane, c.model)
    requests_left, tokens_left = manager.reported(scope, now_wall)
    reason = routing.gate.refusal(c)
    return ModelStatistics(
        model=c.model,
        key=c.key,
        tier=c.tier,
        free_now=reason is None,
        reason=reason or "",
        breaker=routing.gate.breakers(c.lane).model_statistics(c.model, now),
        backoff_s=round(backoff.until - now_wall, 3) if backoff else 0.0,
        backoff_reason=backoff.reason if backoff else None,
        requests_remaining=requests_left,
        tokens_remaining=tokens_left,
        used_today=manager.used(scope, "requests", "day", now_wall),
        quarantined=switches.quarantined().get(c.key),
    )


def _touched(routing: Routing, quarantined: Iterable[str]) -> dict[str, set[str]]:
    """Lane → the models with any state of their own: configured, ranked, a breaker, a backoff, a
    reported quota, usage, a quarantine. A model with none is in its lane's default state."""
    lanes = routing.catalog.lanes
    found: dict[str, set[str]] = {
        name: {m.id for m in lane.spec.models} for name, lane in lanes.items()
    }
    keys = [*routing.ranking.stats, *routing.manager.scopes(), *quarantined]
    keys += [f"{name}/{model}" for name in lanes for model in routing.gate.breakers(name).models]
    for key in keys:
        lane, _, model = key.partition("/")
        if model != "*" and lane in found:
            found[lane].add(model)
    return found


def _lane_models(
    stats_of: Callable[[Candidate], ModelStatistics],
    pool: Pool,
    candidates: Sequence[Candidate],
    touched: set[str],
    limit: int,
) -> tuple[tuple[ModelStatistics, ...], OtherModels | None]:
    """A lane's models to show — all of them, or the `limit` most used of those with a state of
    their own, then the first others, in config order — and the rest summed up."""
    if len(candidates) <= limit:
        return tuple(stats_of(c) for c in candidates), None
    lane = candidates[0].lane
    own = [pool.by_key[k] for m in touched if (k := f"{lane}/{m}") in pool.by_key]
    stats = {c.key: stats_of(c) for c in own}
    own.sort(key=lambda c: (-stats[c.key].used_today, pool.position[c.key]))
    shown, rest = own[:limit], own[limit:]
    plain = (c for c in candidates if c.model not in touched)  # in the lane's default state
    for c in itertools.islice(plain, limit - len(shown)):
        stats[c.key] = stats_of(c)
        shown.append(c)
    free_now = sum(stats[c.key].free_now for c in rest)
    standing = next(plain, None)  # the first plain one not shown stands for the plain rest
    if standing is not None and stats_of(standing).free_now:
        free_now += len(candidates) - len(shown) - len(rest)
    shown.sort(key=lambda c: pool.position[c.key])
    other = OtherModels(models=len(candidates) - len(shown), free_now=free_now)
    return tuple(stats[c.key] for c in shown), other


@attrs.frozen(kw_only=True)
class Sources:
    """What a snapshot reads beside the routing: this process's switches, approvals and paid
    terms, the ledger, the store and its clock, the journal, the lanes that did not load."""

    switches: Switchboard
    approvals: PendingApprovals
    ledger: Ledger
    terms: PaidTerms
    clock: StoreClock
    store: Backend
    journal: Journal
    unavailable: Mapping[str, str]
    models_per_lane: int


def snapshot(
    routing: Routing, sources: Sources, background: BackgroundStatistics | None = None
) -> Statistics:
    now, now_wall = trio.current_time(), routing.now_wall()
    manager, gate, switches, pool = (
        routing.manager,
        routing.gate,
        sources.switches,
        routing.catalog.pool,
    )
    quarantined = switches.quarantined()
    state = _touched(routing, quarantined)

    def stats_of(c: Candidate) -> ModelStatistics:
        return model_statistics(routing, switches, c)

    lanes = []
    for name, lane in routing.catalog.lanes.items():
        models, other = _lane_models(
            stats_of, pool, lane.candidates, state[name], sources.models_per_lane
        )
        free_off = not switches.free_lane_on and any(c.tier == "free" for c in lane.candidates)
        lanes.append(
            LaneStatistics(
                name=name,
                provider=lane.spec.provider,
                kind=lane.spec.free_tier.kind,
                off=switches.is_off(name) or free_off,
                breaker=gate.breakers(name).lane.statistics(now),
                models=models,
                other=other,
                unreachable=routing.health.why_unreachable(name),
                credits_left_usd=manager.credit_left(name, now_wall)
                if isinstance(lane.spec.free_tier, CreditBased)
                else None,
            )
        )
    approvals = tuple(
        {
            "id": a.id,
            "client": a.client,
            "exhausted": list(a.exhausted),
            "candidate": a.candidate,
            "estimated_cost_usd": a.estimated_cost_usd,
            "created_at": a.created_at,
            "waiting": a.waiting,  # jobs of this process waiting on it now
        }
        for a in sources.approvals.pending()
    )
    policy, store = routing.policy(), sources.store
    return Statistics(
        at=now_wall,
        free_lane=switches.free_lane_on,
        lanes=tuple(lanes),
        unavailable=dict(sources.unavailable),
        paid_spent_today_usd=sources.ledger.spent_today(),
        paid_ceiling_usd=policy.paid_ceiling_usd_per_day,
        fallback=policy.free_tier_fallback,
        approvals=approvals,
        recent=sources.journal.recent(),
        quarantined=quarantined,
        store=StoreStatistics(kind=store.kind, where=store.where, up=store.up),
        explored=routing.ranking.explored,
        explored_served=routing.ranking.explored_ok,
        tally=sources.journal.tally.statistics(),
        background=background or BackgroundStatistics(tasks=(), dropped={}),
        clock=sources.clock.statistics(),
        terms=sources.terms.statistics(),
    )

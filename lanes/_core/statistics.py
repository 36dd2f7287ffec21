"""`Dispatcher.statistics()`: one frozen snapshot of everything the operations views show.

`/v1/lanes`, `/metrics`, the status page, `lanes status` and the canary read this record instead of
the dispatcher's attributes, so none of them can change routing state by reading it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import trio

from lanes._core.routing.breaker import BreakerStatistics
from lanes._core.routing.context import Routing
from lanes._core.routing.terms import TermsStatistics
from lanes._core.state.clock import ClockStatistics
from lanes._core.state.journal import Journal
from lanes._core.state.store import Store
from lanes._core.state.tally import TallyStatistics
from lanes._core.tasks import BackgroundStatistics
from lanes.freetier.kinds import CreditBased


@attrs.frozen(kw_only=True)
class ModelStatistics:
    model: str
    key: str  # "lane/model"
    tier: str
    free_now: (
        bool  # could be sent a request now: not switched off, held back or behind an open breaker
    )
    reason: str  # why not ("" when it could)
    breaker: BreakerStatistics
    backoff_s: float
    backoff_reason: str | None
    requests_remaining: float | None  # as the provider last reported (None once its window reset)
    tokens_remaining: float | None
    used_today: int  # requests counted today (UTC), all processes sharing the state
    quarantined: str | None  # why the canary took it out of routing


@attrs.frozen(kw_only=True)
class LaneStatistics:
    name: str
    provider: str
    kind: str
    off: bool  # switched off at runtime, or a free lane while FREE_LANE=off
    breaker: BreakerStatistics  # the lane-level breaker (provider-wide evidence)
    models: tuple[ModelStatistics, ...]
    credits_left_usd: float | None
    unreachable: str | None


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
        lane, _, model = key.partition("/")
        return next(m for m in self.lane(lane).models if m.model == model)


def snapshot(
    routing: Routing,
    *,
    store: Store,
    unavailable: Mapping[str, str],
    journal: Journal,
    background: BackgroundStatistics | None = None,
) -> Statistics:
    now, now_wall = trio.current_time(), routing.now_wall()
    manager, gate = routing.manager, routing.gate
    lanes = []
    for name, lane in routing.lanes.items():
        breakers = routing.breakers[name]
        models = []
        for c in lane.candidates:
            backoff = manager.is_in_backoff(c.lane, c.model, now_wall)
            requests_left, tokens_left = manager.reported(manager.scope(c.lane, c.model), now_wall)
            reason = gate.refusal(c)
            models.append(
                ModelStatistics(
                    model=c.model,
                    key=c.key,
                    tier=c.tier,
                    free_now=reason is None,
                    reason=reason or "",
                    breaker=breakers.model_statistics(c.model, now),
                    backoff_s=round(backoff.until - now_wall, 3) if backoff else 0.0,
                    backoff_reason=backoff.reason if backoff else None,
                    requests_remaining=requests_left,
                    tokens_remaining=tokens_left,
                    used_today=manager.usage.used(
                        manager.scope(c.lane, c.model), "requests", "day", now_wall
                    ),
                    quarantined=gate.quarantine.get(c.key),
                )
            )
        free_lane_off = not gate.free_lane_on and any(c.tier == "free" for c in lane.candidates)
        lanes.append(
            LaneStatistics(
                name=name,
                provider=lane.provider.name,
                kind=lane.free_tier.kind,
                off=name in gate.switched_off or free_lane_off,
                breaker=breakers.lane.statistics(now),
                models=tuple(models),
                unreachable=routing.unreachable.get(name),
                credits_left_usd=manager.credit_left(name, now_wall)
                if isinstance(lane.free_tier, CreditBased)
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
        for a in routing.approvals.pending()
    )
    return Statistics(
        at=now_wall,
        free_lane=gate.free_lane_on,
        lanes=tuple(lanes),
        unavailable=dict(unavailable),
        paid_spent_today_usd=routing.ledger.spent_today(),
        paid_ceiling_usd=routing.policy.paid_ceiling_usd_per_day,
        fallback=routing.policy.free_tier_fallback,
        approvals=approvals,
        recent=journal.recent(),
        quarantined=dict(gate.quarantine),
        store=StoreStatistics(kind=store.kind, where=store.where, up=store.up),
        explored=routing.ranking.explored,
        explored_served=routing.ranking.explored_ok,
        tally=journal.tally.statistics(),
        background=background or BackgroundStatistics(tasks=(), dropped={}),
        clock=routing.clock.statistics(),
        terms=routing.terms.statistics(),
    )

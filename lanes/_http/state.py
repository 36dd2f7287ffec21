"""What the operations endpoints show — readiness, the model list, every lane's state — rendered
from the dispatcher's frozen `statistics()` snapshot."""

from __future__ import annotations

import time
from typing import Any

from lanes._core.dispatcher import Dispatcher
from lanes._core.routing.breaker import BreakerStatistics
from lanes._core.statistics import Statistics


def ready(stats: Statistics) -> list[str]:
    """The lanes that could serve a job now: some candidate passes every gate, and the provider did
    not refuse connections at startup (or has answered since)."""
    return sorted(
        {
            lane.name
            for lane in stats.lanes
            if lane.unreachable is None and any(m.free_now for m in lane.models)
        }
    )


def models_list(dispatcher: Dispatcher, stats: Statistics) -> dict[str, Any]:
    """`/v1/models`: `auto`, the aliases, and every lane's models. `created` is when the provider's
    list says the model was created, else when this sidecar began offering it."""
    opened = int(dispatcher.opened_at)
    data: list[dict[str, Any]] = [
        {"id": "auto", "object": "model", "created": opened, "owned_by": "lanes", "tier": "auto"}
    ]
    data += [
        {
            "id": alias,
            "object": "model",
            "created": opened,
            "owned_by": "lanes",
            "tier": "alias",
            "candidates": keys,
        }
        for alias, keys in dispatcher.config.aliases.items()
    ]
    for lane in stats.lanes:
        served = dispatcher.lanes[lane.name]
        candidates = {c.model: c for c in served.candidates}
        created = {r.id: r.created for r in served.catalog if r.created}
        for m in lane.models:
            candidate = candidates.get(m.model)
            entry = {
                "id": m.key,
                "object": "model",
                "created": created.get(m.model, opened),
                "owned_by": lane.provider,
                "tier": m.tier,
                "context_length": candidate.context if candidate else None,
                "free_now": m.tier != "paid" and m.free_now,
                "free_reason": m.reason,
            }
            if candidate is not None and candidate.embedding:
                entry["embedding"] = True
            data.append(entry)
    return {"object": "list", "data": data}


def breaker_view(stats: BreakerStatistics, now: float) -> dict[str, Any]:
    return {
        "state": stats.state,
        "consecutive_faults": stats.consecutive_faults,
        "reopen_in_s": round(stats.reopen_at - now, 3) if stats.reopen_at else None,
        "open_for_s": round(now - stats.opened_at, 3) if stats.opened_at is not None else None,
        "probing": stats.probe_in_flight,  # the half-open state's one probe is out
    }


def terms_view(stats: Statistics) -> dict[str, Any]:
    """The ceiling and consent this process's config gives, and what it routes by (the store's
    terms: the stricter of every host's, or an operator's) with who set each."""
    terms = stats.terms
    if terms is None:
        return {}
    return {
        "configured": {
            "ceiling_usd": terms.configured.ceiling_usd,
            "consent": terms.configured.consent,
        },
        "effective": {
            "ceiling_usd": terms.effective.ceiling_usd,
            "consent": terms.effective.consent,
            "ceiling_set_by": terms.ceiling_by,
            "consent_set_by": terms.consent_by,
        },
    }


def clock_view(stats: Statistics, most: int = 64) -> dict[str, Any]:
    """This process's wall against the state store's clock, and every live host's (process's)
    view of the day, as the store holds them (at most `most`)."""
    clock, terms = stats.clock, stats.terms
    if clock is None:
        return {}
    hosts = [] if terms is None else list(terms.hosts)[:most]
    return {
        "wall": clock.wall,
        "store": clock.trusted,
        "skew_s": None if clock.skew_s is None else round(clock.skew_s, 3),
        "tolerance_s": clock.tolerance_s,
        "source": clock.source,
        "agrees": not clock.refusal,
        "refusal": clock.refusal,
        "offset_s": clock.offset_s,
        "hosts": [
            {
                "host": h.announced.label,
                "day": _utc_day(h.wall),
                "skew_s": None if h.skew_s is None else round(h.skew_s, 3),
                "seen_s_ago": round(max(0.0, clock.trusted - h.announced.seen), 3),
                "ceiling_usd": h.announced.terms.ceiling_usd,
                "consent": h.announced.terms.consent,
            }
            for h in hosts
        ],
    }


def _utc_day(epoch: float) -> str:
    """The UTC date of `epoch` seconds ("?" for one no calendar holds: it came from a store)."""
    try:
        return time.strftime("%Y-%m-%d", time.gmtime(epoch))
    except (OverflowError, ValueError, OSError):
        return "?"


def lanes_state(stats: Statistics, now: float) -> dict[str, Any]:
    """`/v1/lanes`: `now` is trio's clock, for breaker times."""
    lanes = []
    for lane in stats.lanes:
        models = [
            {
                "model": m.model,
                "tier": m.tier,
                "free_now": m.tier != "paid" and m.free_now,
                "available": m.free_now,
                "reason": m.reason,
                "breaker": breaker_view(m.breaker, now),
                "backoff_s": m.backoff_s,
                "backoff_reason": m.backoff_reason,
                "requests_remaining": m.requests_remaining,
                "tokens_remaining": m.tokens_remaining,
                "used_today": m.used_today,
                "quarantined": m.quarantined,
            }
            for m in lane.models
        ]
        lanes.append(
            {
                "name": lane.name,
                "provider": lane.provider,
                "kind": lane.kind,
                "off": lane.off,
                "breaker": breaker_view(lane.breaker, now),
                "credits_left_usd": lane.credits_left_usd,
                "models": models,
                "unreachable": lane.unreachable,
            }
        )
    return {
        "free_lane": stats.free_lane,
        "lanes": lanes,
        "unavailable": dict(stats.unavailable),
        "paid": {
            "spent_today_usd": stats.paid_spent_today_usd,
            "ceiling_usd": stats.paid_ceiling_usd,
            "fallback": stats.fallback,
            **terms_view(stats),
        },
        "clock": clock_view(stats),
        "approvals": len(stats.approvals),
        "recent": [dict(r) for r in stats.recent],
        "canary": {"quarantined": dict(stats.quarantined)},
        "state": {"kind": stats.store.kind, "where": stats.store.where, "up": stats.store.up},
    }

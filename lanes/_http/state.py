"""What the operations endpoints show: readiness, the model list, and every lane's state."""

from __future__ import annotations

from typing import Any

import trio

from lanes._core.dispatcher import Dispatcher
from lanes.freetier.kinds import CreditBased


def ready(dispatcher: Dispatcher) -> list[str]:
    """The lanes that could serve a job now: some candidate passes every gate, and the provider did
    not refuse connections at startup (or has answered since)."""
    return sorted({c.lane for c in dispatcher.candidates()
                   if dispatcher.free_now(c) and c.lane not in dispatcher.unreachable})


def models_list(dispatcher: Dispatcher) -> dict[str, Any]:
    now = dispatcher.now_wall()
    data: list[dict[str, Any]] = [{"id": "auto", "object": "model", "owned_by": "lanes", "tier": "auto"}]
    data += [{"id": alias, "object": "model", "owned_by": "lanes", "tier": "alias", "candidates": keys}
             for alias, keys in dispatcher.config.aliases.items()]
    for c in dispatcher.candidates():
        verdict = dispatcher.manager.classify(c.lane, c.model, now)
        data.append({"id": c.key, "object": "model", "owned_by": dispatcher.lanes[c.lane].provider.name,
                     "tier": c.tier, "context_length": c.context, "free_now": c.tier != "paid" and verdict.free,
                     "free_reason": verdict.reason})
    return {"object": "list", "data": data}


def lanes_state(dispatcher: Dispatcher) -> dict[str, Any]:
    now_wall, now = dispatcher.now_wall(), trio.current_time()
    manager = dispatcher.manager
    lanes = []
    for name, lane in dispatcher.lanes.items():
        stats = dispatcher.breakers[name].statistics(now)
        models = []
        for c in lane.candidates:
            backoff = manager.is_in_backoff(c.lane, c.model, now_wall)
            snapshot = manager.snapshots.get(manager.scope(c.lane, c.model))
            held = dispatcher.held_back(c)
            models.append({
                "model": c.model, "tier": c.tier, "free_now": c.tier != "paid" and held is None,
                "reason": held or "",
                "backoff_s": round(backoff.until - now_wall, 3) if backoff else 0.0,
                "backoff_reason": backoff.reason if backoff else None,
                "requests_remaining": snapshot[1].requests_remaining if snapshot else None,
                "tokens_remaining": snapshot[1].tokens_remaining if snapshot else None,
                "used_today": manager.usage.used(manager.scope(c.lane, c.model), "requests", "day", now_wall),
            })
        credits = manager.credit_left(name, now_wall) if isinstance(lane.free_tier, CreditBased) else None
        lanes.append({
            "name": name, "provider": lane.provider.name, "kind": lane.free_tier.kind,
            "off": name in dispatcher.switched_off or (not dispatcher.free_lane_on and any(
                c.tier == "free" for c in lane.candidates)),
            "breaker": {"state": stats.state, "consecutive_faults": stats.consecutive_faults,
                        "reopen_in_s": round(stats.reopen_at - now, 3) if stats.reopen_at else None},
            "credits_left_usd": credits, "models": models, "unreachable": dispatcher.unreachable.get(name),
        })
    return {
        "free_lane": dispatcher.free_lane_on,
        "lanes": lanes,
        "unavailable": dispatcher.unavailable,
        "paid": {"spent_today_usd": dispatcher.governors.spent_today(),
                 "ceiling_usd": dispatcher.policy.paid_ceiling_usd_per_day,
                 "fallback": dispatcher.policy.free_tier_fallback},
        "approvals": len(dispatcher.approvals.pending),
        "recent": list(dispatcher.recent),
        "canary": {"quarantined": dict(dispatcher.quarantine)},
        "state": {"kind": dispatcher.store.kind, "where": dispatcher.store.where, "up": dispatcher.store.up},
    }

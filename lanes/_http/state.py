"""What the operations endpoints show — readiness, the model list, every lane's state — rendered
from the dispatcher's frozen `statistics()` snapshot."""

from __future__ import annotations

import time
from typing import Any

from lanes._core.audit.statistics import ModelStatistics, Statistics
from lanes._core.dispatcher import Dispatcher
from lanes._core.model.candidates import Candidate
from lanes._core.policy.breaker import BreakerStatistics


def ready(stats: Statistics) -> list[str]:
    """The lanes that could serve a job now: some candidate passes every gate, and the provider did
    not refuse connections at startup (or has answered since)."""
    return sorted({lane.name for lane in stats.lanes if lane.unreachable is None and lane.free_now})


#: The most entries one page of `/v1/models?limit=` holds.
MAX_PAGE = 1000


def models_list(
    dispatcher: Dispatcher, *, after: str | None = None, limit: int | None = None
) -> dict[str, Any]:
    """`/v1/models`: `auto`, the aliases, and every lane's models, in that order. `created` is when
    the provider's list says the model was created, else when this sidecar began offering it.

    Without `limit` or `after`, the whole list (what OpenAI's SDK reads: its `models.list()` is
    one page and follows no cursor). With either, a cursor page as OpenAI's lists have: at most
    `limit` (100) entries after the one whose id is `after`, `has_more`, `first_id`, `last_id`.
    Raises ValueError naming the parameter for an unknown `after` or a `limit` out of
    1..`MAX_PAGE`."""
    if limit is not None and not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit: must be in 1..{MAX_PAGE} (got {limit})")
    total = 1 + len(dispatcher.config.aliases) + len(dispatcher.candidates())
    start = 0 if after is None else _index(dispatcher, after) + 1
    paged = after is not None or limit is not None
    end = min(total, start + (limit or 100)) if paged else total
    data = _entries(dispatcher, start, end)
    return {
        "object": "list",
        "data": data,
        "has_more": end < total,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
    }


def model_entry(dispatcher: Dispatcher, model_id: str) -> dict[str, Any] | None:
    """The model list's entry for `model_id` (`auto`, an alias or `lane/model`), or None."""
    try:
        index = _index(dispatcher, model_id)
    except ValueError:
        return None
    return _entries(dispatcher, index, index + 1)[0]


def _index(dispatcher: Dispatcher, model_id: str) -> int:
    """Where `model_id` stands in the list. Raises ValueError (for `after`) when it is not in it."""
    aliases = dispatcher.config.aliases
    position = dispatcher.catalog.pool.position
    if model_id == "auto":
        return 0
    if model_id in aliases:
        return 1 + list(aliases).index(model_id)
    if model_id in position:
        return 1 + len(aliases) + position[model_id]
    raise ValueError(f"after: {model_id[:80]!r} is no model's id in the list")


def _entries(dispatcher: Dispatcher, start: int, end: int) -> list[dict[str, Any]]:
    """The list's entries from `start` to `end` (indexes into auto, the aliases, the models)."""
    aliases, pool = list(dispatcher.config.aliases.items()), dispatcher.catalog.pool
    opened = int(dispatcher.opened_at)
    ours = {"object": "model", "created": opened, "owned_by": "lanes"}
    created: dict[str, dict[str, int]] = {}
    data: list[dict[str, Any]] = []
    for i in range(start, end):
        if i == 0:
            data.append({"id": "auto", **ours, "tier": "auto"})
        elif i <= len(aliases):
            alias, candidates = aliases[i - 1]
            data.append({"id": alias, **ours, "tier": "alias", "candidates": candidates})
        else:
            c = pool.candidates[i - 1 - len(aliases)]
            lane = dispatcher.lanes[c.lane]
            if c.lane not in created:
                created[c.lane] = {r.id: r.created for r in lane.catalog if r.created}
            when = created[c.lane].get(c.model, opened)
            data.append(_model(c, dispatcher.refusal(c), lane.spec.provider, when))
    return data


def _model(c: Candidate, reason: str | None, owner: str, created: int) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "id": c.key,
        "object": "model",
        "created": created,
        "owned_by": owner,
        "tier": c.tier,
        "context_length": c.context,
        "free_now": c.tier != "paid" and reason is None,
        "free_reason": reason or "",
    }
    if c.embedding:
        entry["embedding"] = True
    return entry


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


def lanes_state(stats: Statistics, now: float, *, client: str | None = None) -> dict[str, Any]:
    """`/v1/lanes`: `now` is trio's clock, for breaker times. With `client`, the recent jobs and
    pending approvals are that client's only (a client key sees no other tenant's)."""
    lanes = []
    for lane in stats.lanes:
        models = [_model_view(m, lane.unreachable, now) for m in lane.models]
        other = lane.other
        lanes.append(
            {
                "name": lane.name,
                "provider": lane.provider,
                "kind": lane.kind,
                "off": lane.off,
                "breaker": breaker_view(lane.breaker, now),
                "credits_left_usd": lane.credits_left_usd,
                "models": models,
                # the models beyond `[metrics] models_per_lane`, summed up
                "other": {"models": other.models, "free_now": other.free_now} if other else None,
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
        "approvals": sum(1 for a in stats.approvals if client in (None, a["client"])),
        "recent": [dict(r) for r in stats.recent if client in (None, r["client"])],
        "canary": {"quarantined": dict(stats.quarantined)},
        "state": {"kind": stats.store.kind, "where": stats.store.where, "up": stats.store.up},
        "configured": configured(stats),
    }


def _model_view(m: ModelStatistics, unreachable: str | None, now: float) -> dict[str, Any]:
    """One model of a lane's row. A lane whose provider accepted no connection is not free now,
    whatever its quotas say: its reason is why."""
    free = m.free_now and unreachable is None
    return {
        "model": m.model,
        "tier": m.tier,
        "free_now": m.tier != "paid" and free,
        "available": free,
        "reason": unreachable if unreachable is not None else m.reason,
        "breaker": breaker_view(m.breaker, now),
        "backoff_s": m.backoff_s,
        "backoff_reason": m.backoff_reason,
        "requests_remaining": m.requests_remaining,
        "tokens_remaining": m.tokens_remaining,
        "used_today": m.used_today,
        "quarantined": m.quarantined,
    }


def configured(stats: Statistics) -> list[dict[str, Any]]:
    """Every lane the config names, each with what it is doing now: `serving` (some model could
    take a job), `unreachable` (its provider accepted no connection), `off` (switched off),
    `no_models` (none listed or configured yet), `waiting` (every model cooling or closed), or
    `unavailable` (it did not load: no key, no module, disabled) — and why, in words."""
    found = []
    for lane in stats.lanes:
        models = len(lane.models) + (lane.other.models if lane.other else 0)
        if lane.off:
            state, why = "off", "switched off"
        elif lane.unreachable is not None:
            state, why = "unreachable", lane.unreachable
        elif not models:
            state, why = "no_models", "no models listed or configured yet"
        elif lane.free_now:
            state, why = "serving", ""
        else:
            state, why = "waiting", "no model can take a job now (see its models)"
        found.append({"name": lane.name, "kind": lane.kind, "state": state, "why": why})
    found += [
        {"name": name, "kind": "", "state": "unavailable", "why": why}
        for name, why in stats.unavailable.items()
    ]
    return found

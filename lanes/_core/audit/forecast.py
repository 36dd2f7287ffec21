"""The forecast (`GET /v1/forecast`, the page's panel, `lanes status`): how long each free quota
lasts and what the paid day comes to, at the last hour's rate. Pure: it takes the figures (and
`now`) and returns projections, and reads the rate through a `query` function over this host's
audit, as `report.py` does.

A projection is linear and says how it was made: the use in the last `WINDOW_S` (the upstream
attempts of the jobs that ended in it, in this host's audit) as a rate per hour, and what is left
divided by that rate. It is never a fact: every note says "projected", a rate of nothing gives no
time ("no use in the last hour"), and a quota projected to last past its reset says so instead of
giving a time after it. Times are wall-clock epoch seconds (UTC); the paid day is the ledger's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

import attrs

# lanes: pure

Query = Callable[[str, tuple[Any, ...]], list[tuple[Any, ...]]]
Outlook = Literal["used_up", "runs_out", "lasts", "no_rate"]
PaidOutlook = Literal["at_ceiling", "reaches_ceiling", "within", "no_rate"]
WINDOW_S = 3600.0  # the rate's window: the last hour
MOST = 50  # quota entries one forecast lists (the most urgent first); the rest are counted
_URGENCY = {"used_up": 0, "runs_out": 1, "lasts": 2, "no_rate": 3}


@attrs.frozen(kw_only=True)
class Quota:
    """One free quota of one scope ("lane/model", or "lane/*" for an account-wide one) as known
    now: `used` of `limit` in its `window`, which resets at `resets_at` (epoch s). `source` is
    "counted" (the config's limit, our counts) or "reported" (the provider's last headers)."""

    scope: str
    lane: str
    dimension: Literal["requests", "tokens"]
    window: Literal["day", "month"]
    used: float
    limit: float
    resets_at: float
    source: Literal["counted", "reported"]


@attrs.frozen(kw_only=True)
class QuotaForecast:
    quota: Quota
    rate_per_hour: float | None  # None: no use in the window
    outlook: Outlook
    projected_exhausted_at: float | None  # epoch s, only when projected before the reset
    note: str


@attrs.frozen(kw_only=True)
class PaidDay:
    """Today's paid spend (the ledger's UTC day, ending at `ends_at`) against its ceiling, of
    every client or of one (`client`)."""

    spent_usd: float
    ceiling_usd: float
    ends_at: float
    client: str | None = None
    # the day is closed to paid although this spend is under its ceiling: the others' spend took
    # what the global ceiling held (a client's view; how much is not said)
    closed: bool = False
    # `spent_usd` is what this host's audit settled (a shared store keeps no total for the client)
    this_host: bool = False


@attrs.frozen(kw_only=True)
class PaidForecast:
    day: PaidDay
    rate_per_hour_usd: float | None  # None: no paid spend in the window
    outlook: PaidOutlook
    projected_usd: float  # at the day's end, at that rate (never below what is spent)
    projected_ceiling_at: float | None  # when that rate reaches the ceiling, if before the end
    note: str


@attrs.frozen(kw_only=True)
class RecentUse:
    """What the window's attempts used: per (lane, model), requests and tokens (every client's:
    a free quota is shared); and the paid spend (every client's, or one's)."""

    by_model: Mapping[tuple[str, str], tuple[int, int]]
    paid_usd: float


# -- the arithmetic --------------------------------------------------------------------------------


def rate_per_hour(amount: float, window_s: float = WINDOW_S) -> float | None:
    """`amount` used over `window_s` as a rate per hour; None for nothing used (no rate)."""
    if not amount > 0 or not window_s > 0:
        return None
    return amount / window_s * 3600.0


def exhausted_at(
    *, used: float, limit: float, rate_per_hour: float | None, now: float
) -> float | None:
    """When `limit` is used up at `rate_per_hour` from `used` at `now` (epoch s, never before
    `now`; later the lower the rate, infinite when it does not fit a float); None without a
    rate."""
    if rate_per_hour is None or not rate_per_hour > 0:
        return None
    left = max(0.0, limit - used)
    return now + left / rate_per_hour * 3600.0


def spend_at(*, spent: float, rate_per_hour: float | None, now: float, end: float) -> float:
    """What the spend comes to at `end` at `rate_per_hour` from `spent` at `now` (never less
    than `spent`)."""
    hours = max(0.0, end - now) / 3600.0
    return spent + max(0.0, rate_per_hour or 0.0) * hours


def project_quota(quota: Quota, rate: float | None, now: float) -> QuotaForecast:
    """`quota`'s outlook at `rate` (per hour) from `now`, with the note that says how."""
    at = exhausted_at(used=quota.used, limit=quota.limit, rate_per_hour=rate, now=now)
    resets = f"it resets at {when(quota.resets_at)}"
    how = rate_text(rate, quota.dimension)
    outlook: Outlook
    if quota.used >= quota.limit:
        outlook, at, note = "used_up", None, f"used up; {resets}"
    elif at is None:
        outlook, note = "no_rate", f"no use in the last hour: no projection; {resets}"
    elif at >= quota.resets_at:
        outlook, at = "lasts", None
        note = f"projected not to run out before its reset at {when(quota.resets_at)}, {how}"
    else:
        outlook, note = "runs_out", f"projected to run out at {when(at)}, {how}; {resets}"
    return QuotaForecast(
        quota=quota, rate_per_hour=rate, outlook=outlook, projected_exhausted_at=at, note=note
    )


def project_paid(day: PaidDay, rate: float | None, now: float) -> PaidForecast:
    """The paid day's outlook at `rate` (USD per hour) from `now`, with the note that says how."""
    projected = spend_at(spent=day.spent_usd, rate_per_hour=rate, now=now, end=day.ends_at)
    reach = exhausted_at(used=day.spent_usd, limit=day.ceiling_usd, rate_per_hour=rate, now=now)
    ceiling, end = usd(day.ceiling_usd), when(day.ends_at)
    how = rate_text(rate, "usd")
    outlook: PaidOutlook
    if day.spent_usd >= day.ceiling_usd:
        outlook, reach = "at_ceiling", None
        note = f"the ceiling {ceiling} is reached: no paid fallback until {end}"
    elif day.closed:
        outlook, reach = "at_ceiling", None
        note = f"the day's global ceiling is reached: no paid fallback until {end}"
    elif rate is None:
        outlook = "no_rate"
        note = (
            f"no paid spend in the last hour: no projection beyond the {usd(day.spent_usd)} "
            f"spent; the day ends at {end}"
        )
    elif reach is not None and reach < day.ends_at:
        outlook = "reaches_ceiling"
        note = (
            f"projected to reach the ceiling {ceiling} at {when(reach)}, {how} "
            f"(then no paid fallback until {end})"
        )
    else:
        outlook, reach = "within", None
        note = f"projected {usd(projected)} of {ceiling} at {end}, {how}"
    return PaidForecast(
        day=day,
        rate_per_hour_usd=rate,
        outlook=outlook,
        projected_usd=projected,
        projected_ceiling_at=reach,
        note=note,
    )


# -- the words -------------------------------------------------------------------------------------


def when(epoch: float) -> str:
    """An epoch time as the notes say it: "2025-06-01 14:05 UTC" ("later" beyond any calendar)."""
    try:
        return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")
    except (OverflowError, ValueError, OSError):
        return "later"


def amount(value: float) -> str:
    """A count or a rate, as short as it reads: 42, 42.6, 0.25, 12,400."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def usd(value: float) -> str:
    """Dollars: to the cent from $0.10 (and for nothing), else to six places without trailing
    zeros ($0.00003) — the forecast's notes, `lanes status` and `lanes whatif` alike."""
    if abs(value) >= 0.1 or value == 0:
        return f"${value:,.2f}"
    return "$" + f"{value:.6f}".rstrip("0")


def rate_text(rate: float | None, unit: str, window_s: float = WINDOW_S) -> str:
    """How a projection was made: "at the last 60 min's rate: 42 requests/h"."""
    figure = "nothing" if rate is None else (usd(rate) if unit == "usd" else amount(rate))
    per = "/h" if unit == "usd" else f" {unit}/h"
    return f"at the last {window_s / 60:g} min's rate: {figure}{'' if rate is None else per}"


# -- the rate, from the audit ----------------------------------------------------------------------


def recent_use(query: Query, *, since: float, client: str | None = None) -> RecentUse:
    """The attempts of the jobs that ended since `since` (epoch s) in this host's audit: requests
    and tokens per (lane, model), every client's; paid spend, every client's or `client`'s."""
    rows = query(
        "SELECT lane, model, COUNT(*), COALESCE(SUM(tokens), 0) FROM audit_attempt "
        "WHERE at >= ? AND tier = 'free' GROUP BY 1, 2",
        (since,),
    )
    where, args = ("", (since,)) if client is None else (" AND client = ?", (since, client))
    ((paid,),) = query(
        "SELECT COALESCE(SUM(cost_usd), 0) FROM audit_attempt "
        f"WHERE at >= ? AND tier = 'paid'{where}",
        args,
    )
    return RecentUse(
        by_model={(str(lane), str(model)): (int(n), int(t)) for lane, model, n, t in rows},
        paid_usd=float(paid),
    )


def scope_rates(
    use: RecentUse, scope_of: Callable[[str, str], str], window_s: float = WINDOW_S
) -> dict[tuple[str, str], float | None]:
    """(scope, dimension) → the window's rate per hour, the models of one scope summed."""
    sums: dict[tuple[str, str], float] = {}
    for (lane, model), (requests, tokens) in use.by_model.items():
        scope = scope_of(lane, model)
        for dimension, value in (("requests", requests), ("tokens", tokens)):
            sums[(scope, dimension)] = sums.get((scope, dimension), 0.0) + value
    return {key: rate_per_hour(total, window_s) for key, total in sums.items()}


# -- the answer ------------------------------------------------------------------------------------


def urgency(f: QuotaForecast) -> tuple[int, float, float, str]:
    """Used up first, then the soonest to run out, then the fullest; then by scope."""
    at = f.projected_exhausted_at if f.projected_exhausted_at is not None else math.inf
    return (_URGENCY[f.outlook], at, -f.quota.used / f.quota.limit, f.quota.scope)


def forecast_body(
    quotas: Iterable[Quota],
    rates: Mapping[tuple[str, str], float | None],
    paid: PaidDay,
    *,
    paid_rate: float | None,
    now: float,
    most: int = MOST,
) -> dict[str, Any]:
    """The forecast as `GET /v1/forecast` answers it: the method, at most `most` quotas (the most
    urgent first; `left_off` counts the others) and the paid day."""
    projected = sorted(
        (project_quota(q, rates.get((q.scope, q.dimension)), now) for q in quotas), key=urgency
    )
    spend = project_paid(paid, paid_rate, now)
    return {
        "object": "forecast",
        "at": now,
        "method": {
            "window_s": WINDOW_S,
            "since": now - WINDOW_S,
            "rate": "per hour, from the upstream attempts of the jobs that ended in the window "
            "(this host's audit)",
            "projection": "linear: what is left at that rate; projected, not a fact",
            "clock": "UTC; the paid day is the ledger's",
        },
        "quotas": [quota_entry(f) for f in projected[:most]],
        "left_off": max(0, len(projected) - most),
        "paid": paid_entry(spend),
    }


def quota_entry(f: QuotaForecast) -> dict[str, Any]:
    q = f.quota
    return {
        "scope": q.scope,
        "lane": q.lane,
        "dimension": q.dimension,
        "window": q.window,
        "source": q.source,
        "used": q.used,
        "limit": q.limit,
        "resets_at": q.resets_at,
        "rate_per_hour": f.rate_per_hour,
        "outlook": f.outlook,
        "projected_exhausted_at": f.projected_exhausted_at,
        "note": f.note,
    }


def paid_entry(f: PaidForecast) -> dict[str, Any]:
    day = f.day
    return {
        "client": day.client,  # None: every client's spend
        "this_host": day.this_host,  # the client's spend as this host's audit has it
        "spent_usd": day.spent_usd,
        "ceiling_usd": day.ceiling_usd,
        "day_ends_at": day.ends_at,
        "rate_per_hour_usd": f.rate_per_hour_usd,
        "outlook": f.outlook,
        "projected_usd": f.projected_usd,
        "projected_ceiling_at": f.projected_ceiling_at,
        "note": f.note,
    }


def status_lines(body: Mapping[str, Any]) -> Sequence[str]:
    """`lanes status`'s forecast: one line for the paid day, one per quota listed."""
    paid = body["paid"]
    whose = "paid today" if paid["client"] is None else f"paid today (client {paid['client']})"
    lines = [f"forecast: {whose} {usd(paid['spent_usd'])}; {paid['note']}"]
    for q in body["quotas"]:
        lines.append(
            f"forecast: {q['scope']} {q['dimension']}/{q['window']} "
            f"{amount(q['used'])}/{amount(q['limit'])}; {q['note']}"
        )
    if body["left_off"]:
        lines.append(f"forecast: … {body['left_off']} more quotas (GET /v1/forecast)")
    if cache := body.get("cache"):  # the response cache
        lines.append(
            f"forecast: cache {cache['mode']}: {cache['hits']} hits, {cache['misses']} misses; "
            f"saved {amount(cache['saved_tokens'])} tokens and {usd(cache['saved_usd'])}"
        )
    for b in body.get("batches", ()):  # work that can wait
        lines.append(f"forecast: {b['id']} {b['left']} of {b['total']} items left; {b['note']}")
    return lines

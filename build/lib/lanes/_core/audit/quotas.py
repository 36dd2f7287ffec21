"""The forecast's figures as this process knows them now: every free quota per day or per month,
of each scope the free-tier manager keeps (a model's, or a lane's for an account-wide limit), and
the paid day. What they come to is `forecast.py`'s to say.

A quota is the provider's, as its last headers reported it while that window has not reset, or
else the config's (`rpd`, `rpmonth`, `tpd`, `tpmonth`) against the manager's counts — the rule
the manager itself routes by. A model's quota is listed once config names the model, or once it
has been used or reported on; an account-wide one always.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Literal, Protocol

from lanes._core.audit.forecast import PaidDay, Quota
from lanes._core.engine.catalog import Catalog
from lanes._core.freetier.headers import RateLimitSnapshot
from lanes._core.freetier.manager import FreeTierManager
from lanes._core.freetier.windows import window_end

Dimension = Literal["requests", "tokens"]
Window = Literal["day", "month"]
_LIMITS: tuple[tuple[str, Dimension, Window], ...] = (
    ("rpd", "requests", "day"),
    ("rpmonth", "requests", "month"),
    ("tpd", "tokens", "day"),
    ("tpmonth", "tokens", "month"),
)
_WINDOWS: dict[float, Window] = {86400.0: "day", 2592000.0: "month"}
_DIMENSIONS: dict[str, Dimension] = {"requests": "requests", "tokens": "tokens"}


def free_quotas(catalog: Catalog, manager: FreeTierManager, now: float) -> list[Quota]:
    """Every day's and month's free quota of every scope with one, as known at `now` (epoch s)."""
    found: list[Quota] = []
    for name, lane in catalog.lanes.items():
        kind = lane.spec.free_tier
        limits = [(d, w, float(n)) for key, d, w in _LIMITS if (n := getattr(kind, key, None))]
        for scope in _scopes(catalog, manager, name, (m.id for m in lane.spec.models)):
            found += _quotas(manager, name, scope, limits, now)
    return found


def _scopes(
    catalog: Catalog, manager: FreeTierManager, lane: str, configured: Iterable[str]
) -> list[str]:
    """The scopes of `lane`'s free models worth a forecast: its configured ones, and every one
    the manager knows something of (an account-wide scope, `lane/*`, stands for all of them)."""
    by_key = catalog.pool.by_key
    named = [manager.scope(lane, model) for model in configured]
    known = [s for s in manager.scopes() if s.startswith(f"{lane}/")]
    scopes = []
    for scope in dict.fromkeys([*named, *known]):
        candidate = by_key.get(scope)
        if scope == f"{lane}/*" or (candidate is not None and candidate.tier == "free"):
            scopes.append(scope)
    return scopes


def _quotas(
    manager: FreeTierManager,
    lane: str,
    scope: str,
    limits: list[tuple[Dimension, Window, float]],
    now: float,
) -> list[Quota]:
    entry = manager.snapshot(scope)
    found = {} if entry is None else _reported(lane, scope, *entry, now)
    for dimension, window, limit in limits:
        if (dimension, window) not in found:
            found[(dimension, window)] = Quota(
                scope=scope,
                lane=lane,
                dimension=dimension,
                window=window,
                used=float(manager.used(scope, dimension, window, now)),
                limit=limit,
                resets_at=window_end(window, now),
                source="counted",
            )
    return list(found.values())


def _reported(
    lane: str, scope: str, at: float, snapshot: RateLimitSnapshot, now: float
) -> dict[tuple[Dimension, Window], Quota]:
    """The day and month windows the provider reported at `at`, those not reset since (a reset
    not given counts as a minute, as the manager reads it)."""
    found: dict[tuple[Dimension, Window], Quota] = {}
    for w in snapshot.windows:
        window = _WINDOWS.get(w.window_s or 0.0)
        dimension = _DIMENSIONS.get(w.dimension)
        if window is None or dimension is None or not w.limit or w.remaining is None:
            continue
        if at + (w.reset_s or 60.0) <= now:
            continue
        found[(dimension, window)] = Quota(
            scope=scope,
            lane=lane,
            dimension=dimension,
            window=window,
            used=max(0.0, w.limit - w.remaining),
            limit=w.limit,
            resets_at=at + w.reset_s if w.reset_s else window_end(window, now),
            source="reported",
        )
    return found


def audited_spend(query: Callable[..., list[tuple[Any, ...]]], client: str, since: float) -> float:
    """What this host's audit settled for `client`'s jobs that ended since `since` (epoch s)."""
    ((spent,),) = query(
        "SELECT COALESCE(SUM(cost_usd), 0) FROM audit WHERE client = ? AND at >= ?", (client, since)
    )
    return float(spent)


class PaidLedgerView(Protocol):
    """What the paid day is read from: the ledger (`money/ledger.py`)."""

    def ceiling(self, client: str | None = None) -> float: ...
    def client_ceiling(self, client: str) -> float | None: ...
    def left_today(self, client: str | None = None) -> float: ...
    def spent_today(self, client: str | None = None) -> float: ...
    def day_ends_at(self) -> float: ...


def paid_day(
    ledger: PaidLedgerView,
    shared: bool,
    client: str | None = None,
    *,
    audited: Callable[[str, float], float] | None = None,
) -> PaidDay:
    """Today's paid spend against the ceiling in force: every client's, or `client`'s own against
    the lower of the ceiling and its own (as `GET /v1/report` shows a client) — and `closed` when
    the others' spend took what the global ceiling held (not how much: that is theirs).

    A `shared` store (Redis) keeps a client's own total only when it has a ceiling of its own: for
    any other client the spend is what this host's audit settled for it since the day began
    (`audited(client, day_start)`), never every client's and never a made-up zero."""
    ends_at = ledger.day_ends_at()
    if client is None:
        return PaidDay(
            spent_usd=ledger.spent_today(), ceiling_usd=ledger.ceiling(), ends_at=ends_at
        )
    this_host = ledger.client_ceiling(client) is None and shared
    if this_host:
        spent = audited(client, ends_at - 86400.0) if audited is not None else 0.0
    else:
        spent = ledger.spent_today(client)
    return PaidDay(
        spent_usd=spent,
        ceiling_usd=ledger.ceiling(client),  # the global one, for a client without its own
        ends_at=ends_at,
        client=client,
        closed=ledger.left_today(client) <= 0.0,
        this_host=this_host,
    )

"""The FreeTierManager: one shared view of every free candidate's quota, backoff and credit.

No I/O and no clock of its own: every method takes `now`, wall-clock epoch seconds (quota windows
and provider resets are calendar facts; the dispatcher derives `now` from trio's clock once). The
store that persists it and shares it with other processes is driven from outside (`drain`/`merge`).

The router's three integration points (seed 000):
- before routing: `is_in_backoff()` / `classify()` — skip without sending;
- sending a request: `sending()`;
- after a response: `update_from_headers()` and `count_usage()`;
- after an error: `back_off()`.
`next_free_at()` is the soonest moment a free candidate reopens: the sidecar's exact Retry-After.
"""

from __future__ import annotations

import math
import random as _random
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, NamedTuple

import attrs

from lanes._core.freetier.backoff import Backoff, Reason, backoff_for, relax
from lanes._core.freetier.headers import RateLimitSnapshot, parse_rate_limit
from lanes._core.freetier.kinds import (
    AlwaysFreeLocal,
    CreditBased,
    FreeModelsOnly,
    FreeTierKind,
    NoFreeTier,
    Subscription,
)
from lanes._core.freetier.prices import usage_total
from lanes._core.freetier.unreported import DEFAULT_RESET_S, Unreported, combined, period_now
from lanes._core.freetier.windows import Key as UsageKey
from lanes._core.freetier.windows import UsageCounter, WindowName, window_end, window_id

VerdictKind = Literal["always_free", "free_within_limits", "not_free"]
_LIMITS: tuple[tuple[str, str, WindowName], ...] = (
    ("rpm", "requests", "minute"),
    ("rpd", "requests", "day"),
    ("rpmonth", "requests", "month"),
    ("tpm", "tokens", "minute"),
    ("tpd", "tokens", "day"),
    ("tpmonth", "tokens", "month"),
)


def kept(limit: float, headroom: float) -> int:
    """How much of a quota of `limit` its `headroom` keeps for interactive work: the share,
    rounded up to a whole request or token (a quota of 4 at 0.2 keeps 1), 0 without one."""
    return math.ceil(limit * headroom - 1e-9) if headroom > 0 else 0


class Held(NamedTuple):
    """What the manager holds for a store: usage counts, credit spend by (lane, day), backoffs
    and header snapshots by scope (`take_pending` hands over the changes, `view` copies it all)."""

    usage: list[tuple[UsageKey, int]]
    spend: dict[tuple[str, int], float]
    backoffs: dict[str, Backoff]
    snapshots: dict[str, tuple[float, RateLimitSnapshot]]


@attrs.frozen(kw_only=True)
class QuotaVerdict:
    """`classify`'s answer: free now or not, why, and (when not) when it will be again (epoch s)."""

    kind: VerdictKind
    reason: str = ""
    free_again_at: float | None = None

    @property
    def free(self) -> bool:
        return self.kind != "not_free"


@attrs.frozen(kw_only=True)
class LaneTerms:
    """What the manager must know about one lane: its kind and how to read its headers."""

    kind: FreeTierKind
    # dimension → window_s for bare headers
    conventions: Mapping[str, float] = attrs.field(factory=dict)
    declared: Mapping[str, bool] = attrs.field(factory=dict)  # model → its `free` flag, where set

    def is_free(self, model: str) -> bool:
        """Is `model` borrowed-free (or owned) capacity? Its `free` flag first, then the kind."""
        flag = self.declared.get(model)
        if flag is not None:
            return flag
        if isinstance(self.kind, NoFreeTier):
            return False
        return not isinstance(self.kind, FreeModelsOnly) or self.kind.covers(model)


class FreeTierManager:
    """Shared quota and backoff state. One per process; other processes share it through the
    store."""

    def __init__(
        self, *, random: Callable[[], float] = _random.random, jitter: float = 0.1
    ) -> None:
        self._random = random
        self._jitter = jitter
        self._terms: dict[str, LaneTerms] = {}
        self._backoffs: dict[str, Backoff] = {}  # scope ("lane/model" or "lane/*") → backoff
        self._snapshots: dict[str, tuple[float, RateLimitSnapshot]] = {}  # scope → (at, snapshot)
        self._unreported = Unreported()  # the sends here their answers have not reported on
        self._usage = UsageCounter()
        self._spend: dict[tuple[str, int], float] = {}  # (lane, period id) → USD spent from credits
        # lane → (at, remaining USD, spend then)
        self._balances: dict[str, tuple[float, float, float]] = {}
        self._credit_held: dict[str, float] = {}  # lane → USD held by its attempts in flight here
        # scopes known to be serving: no single-flight probe needed
        self._confirmed: set[str] = set()
        self._steps: dict[str, int] = {}
        self._pending_usage: list[tuple[UsageKey, int]] = []
        self._pending_spend: dict[tuple[str, int], float] = {}
        self._changed_backoffs: dict[str, Backoff] = {}
        self._changed_snapshots: dict[str, tuple[float, RateLimitSnapshot]] = {}
        self._clamped: dict[tuple[str, str], bool] = {}  # (lane, what) → already handed out

    def register(self, lane: str, terms: LaneTerms) -> None:
        self._terms[lane] = terms

    # -- scopes ---------------------------------------------------------------------------------
    def _account_wide(self, lane: str, model: str) -> bool:
        """Does the lane's account-wide free quota cover `model`? Never a paid model's: a free
        quota used up must not hold back what the account pays for."""
        terms = self._terms.get(lane)
        if terms is None or not getattr(terms.kind, "account_wide", False):
            return False
        return terms.is_free(model)

    def scope(self, lane: str, model: str) -> str:
        """Where limits are kept: per model, or per lane when the provider's limit is account-wide
        (for the models that limit covers)."""
        return f"{lane}/*" if self._account_wide(lane, model) else f"{lane}/{model}"

    # -- before routing ----------------------------------------------------------------------------
    def is_in_backoff(self, lane: str, model: str, now: float) -> Backoff | None:
        """The backoff in force for this candidate (its own, or its lane's account-wide one when
        that covers it), or None."""
        keys = (f"{lane}/{model}", self.scope(lane, model))
        found = [b for key in keys if (b := self._backoffs.get(key)) and b.until > now]
        return max(found, key=lambda b: b.until) if found else None

    def classify(self, lane: str, model: str, now: float, headroom: float = 0.0) -> QuotaVerdict:
        """AlwaysFree (owned or subscribed), FreeWithinLimits, or NotFree with the reason and
        when. `headroom` (0..1, work that can wait): that share of every quota — counted, reported
        or credit — is kept for interactive work, so the quota counts as used up earlier."""
        terms = self._terms.get(lane) or LaneTerms(kind=NoFreeTier())
        kind = terms.kind
        if not terms.is_free(model):
            return QuotaVerdict(kind="not_free", reason="paid model")
        if isinstance(kind, (AlwaysFreeLocal, Subscription)):
            return QuotaVerdict(kind="always_free")
        backoff = self.is_in_backoff(lane, model, now)
        if backoff is not None:
            return QuotaVerdict(
                kind="not_free",
                reason=f"backoff ({backoff.reason}, {backoff.source})",
                free_again_at=backoff.until,
            )
        over = self._over_local_limit(lane, model, kind, now, headroom) or (
            self._kept_for_interactive(self.scope(lane, model), now, headroom) if headroom else None
        )
        if over is not None:
            return over
        if isinstance(kind, CreditBased):
            left = self.credit_left(lane, now)
            if left is not None and left <= headroom * kind.budget_usd:
                return QuotaVerdict(
                    kind="not_free",
                    reason="credits exhausted",
                    free_again_at=self._period_end(kind, now),
                )
        return QuotaVerdict(kind="free_within_limits")

    def held_lane_wide(self, lane: str, model: str, now: float) -> str | None:
        """Why every free model of `lane` is held back now — an account-wide backoff or limit that
        covers `model`, or its credits used up — or None (then `model`'s own state may be why)."""
        terms = self._terms.get(lane)
        if terms is None or not terms.is_free(model):
            return None
        kind = terms.kind
        if isinstance(kind, (AlwaysFreeLocal, Subscription)):
            return None
        if self._account_wide(lane, model):
            backoff = self._backoffs.get(f"{lane}/*")
            if backoff is not None and backoff.until > now:
                return f"backoff ({backoff.reason}, {backoff.source})"
            over = self._over_local_limit(lane, model, kind, now)
            if over is not None:
                return over.reason
        if isinstance(kind, CreditBased):
            left = self.credit_left(lane, now)
            if left is not None and left <= 0:
                return "credits exhausted"
        return None

    def _over_local_limit(
        self, lane: str, model: str, kind: FreeTierKind, now: float, headroom: float = 0.0
    ) -> QuotaVerdict | None:
        """Client-side counts against configured limits (less the `headroom` kept for
        interactive work) — only where no fresh header speaks."""
        scope = self.scope(lane, model)
        fresh = self._fresh_windows(scope, now)
        for key, dimension, window in _LIMITS:
            limit = getattr(kind, key, None)
            if not limit or (dimension, window) in fresh:
                continue
            if self._usage.used(scope, dimension, window, now) >= limit - kept(limit, headroom):
                why = f", {headroom:.0%} kept for interactive work" if headroom else ""
                return QuotaVerdict(
                    kind="not_free",
                    reason=f"{key}={limit} used up (counted here{why})",
                    free_again_at=window_end(window, now),
                )
        return None

    def _kept_for_interactive(self, scope: str, now: float, headroom: float) -> QuotaVerdict | None:
        """Is what is left of a window the provider reported — its last figure, or its limit once
        it reset, less the sends here no report covers (`unreported.py`) — within the share
        `headroom` kept for interactive work? Then NotFree until that window resets."""
        entry = self._snapshots.get(scope)
        if entry is None:
            return None
        at, snapshot = entry
        for w in snapshot.windows:
            if w.limit is None or (found := period_now(at, w, now)) is None:
                continue
            start, end, left = found
            if left - self._unreported.since(scope, w.dimension, start) <= kept(w.limit, headroom):
                return QuotaVerdict(
                    kind="not_free",
                    reason=f"{headroom:.0%} of {w.dimension} kept for interactive work",
                    free_again_at=end,
                )
        return None

    def _fresh_windows(self, scope: str, now: float) -> set[tuple[str, str]]:
        names = {60.0: "minute", 86400.0: "day", 2592000.0: "month"}
        entry = self._snapshots.get(scope)
        if entry is None:
            return set()
        at, snapshot = entry
        return {
            (w.dimension, names[w.window_s])
            for w in snapshot.windows
            if w.window_s in names and w.remaining is not None and at + (w.reset_s or 60.0) > now
        }

    def reported(self, scope: str, now: float) -> tuple[float | None, float | None]:
        """Requests and tokens remaining as reported (`snapshot`) — None for a figure whose window
        has reset since (a reset not given counts as a minute): an old "0 left" is not believed."""
        entry = self._snapshots.get(scope)
        if entry is None:
            return None, None
        at, snap = entry

        def fresh(value: float | None, reset_s: float | None) -> float | None:
            return value if value is not None and at + (reset_s or 60.0) > now else None

        return (
            fresh(snap.requests_remaining, snap.reset_requests_s),
            fresh(snap.tokens_remaining, snap.reset_tokens_s),
        )

    def reports_tokens(self, lane: str, model: str) -> bool:
        """Did the provider's last report on this candidate's scope give a token window (its limit
        and remaining)? Then what a request may use of it is wanted (`sending`)."""
        entry = self._snapshots.get(self.scope(lane, model))
        return entry is not None and any(
            w.dimension == "tokens" and w.limit is not None and w.remaining is not None
            for w in entry[1].windows
        )

    def snapshot(self, scope: str) -> tuple[float, RateLimitSnapshot] | None:
        """What the provider reported of `scope`'s limits, and when (epoch s), if ever: its last
        answer's, but of a window still running the lowest figure it gave (`unreported.combined`:
        answers to requests sent together arrive in any order)."""
        return self._snapshots.get(scope)

    def needs_probe(self, lane: str, model: str) -> bool:
        """True while nothing proves the candidate serving: send one request, hold the others."""
        terms = self._terms.get(lane)
        if terms is None or isinstance(terms.kind, (AlwaysFreeLocal, Subscription, NoFreeTier)):
            return False
        return self.scope(lane, model) not in self._confirmed

    # -- sending -----------------------------------------------------------------------------------
    def sending(self, lane: str, model: str, *, now: float, expected_tokens: int = 0) -> int:
        """One request sent now: counted against every window (`count_usage`) and, until its
        answer reports on it, taken from what the provider reported left (with the
        `expected_tokens` it may use of a token window: input estimated, output capped). Returns
        its number, for its answer's `update_from_headers(sent=)`."""
        self.count_usage(lane, model, now=now)
        scope = self.scope(lane, model)
        entry = self._snapshots.get(scope)
        # what no window counts any more is let go: sends before the periods running, or, with
        # nothing reported yet, a minute ago
        starts = (
            [found[0] for w in entry[1].windows if (found := period_now(entry[0], w, now))]
            if entry
            else []
        )
        return self._unreported.add(
            scope,
            now,
            requests=1,
            tokens=expected_tokens,
            keep_from=min(starts) if starts else now - DEFAULT_RESET_S,
        )

    # -- after a response --------------------------------------------------------------------------
    def update_from_headers(
        self,
        lane: str,
        model: str,
        headers: Any,
        *,
        status: int,
        now: float,
        body: Any = None,
        sent: int | None = None,
    ) -> RateLimitSnapshot:
        """Parse and keep what the provider reported (`snapshot`) — in its answer to request
        number `sent` (`sending`'s), if given; `remaining: 0` parks the scope until its reset."""
        terms = self._terms.get(lane)
        snapshot = parse_rate_limit(
            headers,
            status=status,
            body=body,
            now_wall=now,
            conventions=terms.conventions if terms else None,
        )
        for what in snapshot.clamped:
            self._clamped.setdefault((lane, what), False)
        scope = self.scope(lane, model)
        if snapshot.windows:
            kept_now = (now, combined(self._snapshots.get(scope), now, snapshot))
            self._snapshots[scope] = self._changed_snapshots[scope] = kept_now
            if sent is not None:
                self._unreported.reported(scope, sent)
        if 200 <= status < 300:
            if any(w.remaining == 0 for w in snapshot.windows):
                self._enter(scope, "quota_exhausted", snapshot, now)
            else:
                self._confirmed.add(scope)
                self._steps[scope] = relax(self._steps.get(scope, 0))
        return snapshot

    def count_usage(
        self,
        lane: str,
        model: str,
        *,
        now: float,
        requests: int = 1,
        tokens: int = 0,
        usage: Mapping[str, Any] | None = None,
    ) -> None:
        """Count one request (and its tokens) against every window. What it cost a credit lane is
        the paid gate's to settle (`settle_credit`)."""
        if usage:
            total = usage_total(usage)  # bounded: an upstream's usage is never trusted raw
            tokens = total if total is not None else tokens
        self._pending_usage += self._usage.add(
            self.scope(lane, model), now, requests=requests, tokens=tokens
        )

    def _spend_credit(self, lane: str, kind: CreditBased, cost: float, now: float) -> None:
        key = (lane, self._period_id(kind, now))
        self._spend[key] = self._spend.get(key, 0.0) + cost
        self._pending_spend[key] = self._pending_spend.get(key, 0.0) + cost

    # -- after an error ----------------------------------------------------------------------------
    def back_off(
        self,
        lane: str,
        model: str,
        reason: Reason,
        *,
        headers: Any = None,
        status: int | None = None,
        body: Any = None,
        now: float,
        sent: int | None = None,
    ) -> Backoff:
        """Enter (or extend) the coordinated backoff after a 429, 402 or model-gone answer (to
        request number `sent`, if given: see `update_from_headers`)."""
        snapshot = self.update_from_headers(
            lane, model, headers or {}, status=status or 429, now=now, body=body, sent=sent
        )
        scope = f"{lane}/{model}" if reason == "model_gone" else self.scope(lane, model)
        return self._enter(scope, reason, snapshot, now)

    def _enter(
        self, scope: str, reason: Reason, snapshot: RateLimitSnapshot, now: float
    ) -> Backoff:
        current = self._backoffs.get(scope)
        step = self._steps.get(scope, 0)
        if current is not None and now - current.until > 60.0:
            step = relax(step)  # it expired and stayed quiet: one burst must not climb for ever
        proposed = backoff_for(
            reason, snapshot, step=step, now=now, random=self._random, jitter=self._jitter
        )
        self._steps[scope] = proposed.step
        self._confirmed.discard(scope)
        if current is not None and current.until >= proposed.until:
            return current  # never shorten a longer backoff already in force
        self._backoffs[scope] = self._changed_backoffs[scope] = proposed
        return proposed

    # -- credits -----------------------------------------------------------------------------------
    def _period_id(self, kind: CreditBased, now: float) -> int:
        return {"daily": window_id("day", now), "monthly": window_id("month", now)}.get(
            kind.reset, 0
        )

    def _period_end(self, kind: CreditBased, now: float) -> float | None:
        return {"daily": window_end("day", now), "monthly": window_end("month", now)}.get(
            kind.reset
        )

    def credit_spent(self, lane: str, now: float) -> float:
        kind = self._terms[lane].kind
        assert isinstance(kind, CreditBased)
        return self._spend.get((lane, self._period_id(kind, now)), 0.0)

    def credit_left(self, lane: str, now: float) -> float | None:
        """USD left: the provider's last reported balance less what was spent since, else the
        estimate."""
        kind = self._terms[lane].kind
        if not isinstance(kind, CreditBased):
            return None
        spent = self.credit_spent(lane, now)
        if lane in self._balances:
            _, remaining, spent_then = self._balances[lane]
            return remaining - max(0.0, spent - spent_then)
        return kind.budget_usd - spent if kind.budget_usd else None

    def credit_metered(self, lane: str, model: str, now: float) -> bool:
        """Does an attempt on `model` spend the lane's credits, and are they known (a budget, or a
        balance the provider reported)? A model whose `free` flag is set costs no credits."""
        terms = self._terms.get(lane)
        if terms is None or not isinstance(terms.kind, CreditBased):
            return False
        return terms.declared.get(model) is not True and self.credit_left(lane, now) is not None

    def hold_credit(self, lane: str, amount_usd: float, now: float) -> str | None:
        """Hold `amount_usd` (an attempt's worst case) against the credits left, less what this
        process's attempts in flight hold; or say why it does not fit (nothing held then)."""
        left = self.credit_left(lane, now)
        held = self._credit_held.get(lane, 0.0)
        if left is not None and amount_usd > left - held + 1e-12:
            in_flight = f" (${held:.6f} of it held by attempts in flight)" if held else ""
            return (
                f"worst case ${amount_usd:.6f} is more than the ${max(left, 0.0):.6f} of credits "
                f"left{in_flight}"
            )
        self._credit_held[lane] = held + amount_usd
        return None

    def settle_credit(self, lane: str, held_usd: float, cost_usd: float, now: float) -> None:
        """Release a hold (`held_usd`, 0 for none) and spend what the attempt cost from the lane's
        credits (`cost_usd`, never below 0; nothing for a lane that is not a credit lane): the one
        way credits are charged."""
        left = self._credit_held.get(lane, 0.0) - held_usd
        if left > 1e-12:
            self._credit_held[lane] = left
        else:
            self._credit_held.pop(lane, None)
        kind = self._terms[lane].kind
        if isinstance(kind, CreditBased) and cost_usd > 0:
            self._spend_credit(lane, kind, cost_usd, now)

    def set_balance(self, lane: str, remaining_usd: float, *, now: float) -> None:
        """The provider's own balance figure: it wins over the local estimate."""
        self._balances[lane] = (now, remaining_usd, self.credit_spent(lane, now))

    # -- the soonest reopening ---------------------------------------------------------------------
    def next_free_at(
        self, candidates: Iterable[tuple[str, str]], now: float, headroom: float = 0.0
    ) -> tuple[float, str] | None:
        """(epoch seconds, "lane/model") of the soonest moment a candidate now not free reopens
        (for work that keeps `headroom`, see `classify`)."""
        soonest = None
        for lane, model in candidates:
            verdict = self.classify(lane, model, now, headroom)
            if (
                verdict.kind == "not_free"
                and verdict.free_again_at is not None
                and (soonest is None or verdict.free_again_at < soonest[0])
            ):
                soonest = (verdict.free_again_at, f"{lane}/{model}")
        return soonest

    def day_left(self, lane: str, model: str, now: float, headroom: float = 0.0) -> float | None:
        """Requests of its day `lane/model` has left for work that keeps `headroom` (see
        `classify`): the fewest of what the provider last reported of a day window and what our
        count leaves of a configured `rpd`; None when no daily request limit is known."""
        terms, scope = self._terms.get(lane), self.scope(lane, model)
        found: list[float] = []
        entry = self._snapshots.get(scope)
        if entry is not None:
            at, snapshot = entry
            found += [
                w.remaining - kept(w.limit, headroom)
                for w in snapshot.windows
                if w.window_s == 86400.0 and w.dimension == "requests" and w.limit is not None
                and w.remaining is not None and at + (w.reset_s or 60.0) > now
            ]  # fmt: skip
        limit = getattr(terms.kind, "rpd", None) if terms is not None else None
        if limit and ("requests", "day") not in self._fresh_windows(scope, now):
            used = self._usage.used(scope, "requests", "day", now)
            found.append(limit - kept(limit, headroom) - used)
        return max(0.0, min(found)) if found else None

    # -- sharing through a store -------------------------------------------------------------------
    def take_pending(self) -> Held:
        """Hand over what changed since the last call (usage, spend, backoffs, snapshots) for the
        store."""
        out = Held(
            self._pending_usage,
            self._pending_spend,
            self._changed_backoffs,
            self._changed_snapshots,
        )
        self._pending_usage, self._pending_spend = [], {}
        self._changed_backoffs, self._changed_snapshots = {}, {}
        return out

    # What the rest of lanes reads and changes of the manager, by name (its state stays private).

    def used(self, scope: str, dimension: str, window: WindowName, now: float) -> int:
        """This host's count of `dimension` in `scope`'s current `window`."""
        return self._usage.used(scope, dimension, window, now)

    def count_request(self, scope: str, now: float) -> None:
        """One request against `scope` (a governor's count), queued for the store."""
        self._pending_usage += self._usage.add(scope, now, requests=1)

    def confirm(self, scope: str) -> None:
        """`scope` answered: its first probe is done, it needs no other."""
        self._confirmed.add(scope)

    def confirmed(self, scope: str) -> bool:
        return scope in self._confirmed

    def backoff(self, scope: str) -> Backoff | None:
        """The backoff `scope` is under (whether or not it has ended), if any."""
        return self._backoffs.get(scope)

    def forget_backoff(self, scope: str) -> None:
        """Drop `scope`'s backoff here (it comes back with the next sync if another wrote it)."""
        self._backoffs.pop(scope, None)

    def changed_backoffs(self) -> dict[str, Backoff]:
        """The backoffs changed since the store last took them (a copy; `take_pending` takes)."""
        return dict(self._changed_backoffs)

    def credit_held(self) -> dict[str, float]:
        """USD held per lane by this process's attempts in flight (a copy)."""
        return dict(self._credit_held)

    def scopes(self) -> list[str]:
        """Every scope the manager knows something of — a backoff, a snapshot, a count — each
        once, in that order."""
        found = [*self._backoffs, *self._snapshots, *(key[0] for key in self._usage.counts)]
        return list(dict.fromkeys(found))

    def view(self) -> Held:
        """Copies of what a store reseeds from: counts, credit spend, backoffs, snapshots."""
        return Held(
            list(self._usage.counts.items()),
            dict(self._spend),
            dict(self._backoffs),
            dict(self._snapshots),
        )

    def give_back(
        self,
        usage: Iterable[tuple[UsageKey, int]],
        spend: Mapping[tuple[str, int], float],
        backoffs: Mapping[str, Backoff],
        snapshots: Mapping[str, tuple[float, RateLimitSnapshot]],
        now: float,
    ) -> None:
        """Queue again what the store did not take: counts of windows still running, spend,
        backoffs still live, snapshots (what changed since stays the newer)."""
        merged: dict[UsageKey, int] = {}
        for counter, delta in [*usage, *self._pending_usage]:
            if counter[3] >= window_id(counter[2], now):  # an ended window is read by no one
                merged[counter] = merged.get(counter, 0) + delta
        self._pending_usage = list(merged.items())
        for period, usd in spend.items():
            self._pending_spend[period] = self._pending_spend.get(period, 0.0) + usd
        live = {s: b for s, b in backoffs.items() if b.until > now}
        self._changed_backoffs = {**live, **self._changed_backoffs}
        self._changed_snapshots = {**snapshots, **self._changed_snapshots}

    def merge_usage(self, counts: Iterable[tuple[UsageKey, int]], now: float) -> None:
        """Take the host's (or fleet's) counts, then drop the windows that ended."""
        self._usage.merge(counts)
        self._usage.prune(now)

    def take_clamped(self) -> list[tuple[str, str]]:
        """(lane, what) for each kind of out-of-bounds value a lane sent that was not handed out
        before (once per process: the caller logs each one line)."""
        fresh = [key for key, told in self._clamped.items() if not told]
        for key in fresh:
            self._clamped[key] = True
        return fresh

    def merge_spend(self, totals: Mapping[tuple[str, int], float]) -> None:
        """Take spend totals read from the store (they include other processes' spend)."""
        for key, usd in totals.items():
            if usd > self._spend.get(key, 0.0):
                self._spend[key] = usd

    def merge_snapshots(self, snapshots: Mapping[str, tuple[float, RateLimitSnapshot]]) -> None:
        for scope, (at, snapshot) in snapshots.items():
            if scope not in self._snapshots or self._snapshots[scope][0] < at:
                self._snapshots[scope] = (at, combined(self._snapshots.get(scope), at, snapshot))

    def merge_backoffs(self, rows: Iterable[tuple[str, Backoff]]) -> None:
        """Take backoffs other processes wrote; the later deadline wins."""
        for scope, backoff in rows:
            current = self._backoffs.get(scope)
            if current is None or backoff.until > current.until:
                self._backoffs[scope] = backoff
                self._confirmed.discard(scope)

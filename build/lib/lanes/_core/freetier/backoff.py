"""How long to stay away from a candidate after a 429, a 402 or a vanished model. Pure.

The duration comes from, in order: the provider's `retry-after`; the reset of the window the
headers show exhausted; a daily quota parks until that day's window resets (UTC midnight when no
header says otherwise); else a ladder — 1, 2, 4 … 60 s for rate limits, 5 min … 24 h for credits,
30 min → 1 h for a model that is gone. A small *positive* jitter (from an injectable source) keeps
many clients from returning at the same instant. No backoff is longer than `MAX_WAIT_S` (7 days,
plus its jitter), whatever a provider says.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import attrs

from lanes._core.freetier.headers import MAX_WAIT_S, RateLimitSnapshot
from lanes._core.freetier.windows import window_end

Reason = Literal["rate_limited", "credit_exhausted", "model_gone", "quota_exhausted"]

RATE_LADDER_S = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0)
CREDIT_LADDER_S = (300.0, 900.0, 3600.0, 21600.0, 86400.0)
GONE_LADDER_S = (1800.0, 3600.0)
LADDERS = {
    "rate_limited": RATE_LADDER_S,
    "quota_exhausted": RATE_LADDER_S,
    "credit_exhausted": CREDIT_LADDER_S,
    "model_gone": GONE_LADDER_S,
}
DAY_S = 86400.0


MAX_EPOCH_S = 1e11  # a deadline beyond this (the year 5138) is garbage, whoever wrote it


def _epoch(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not -MAX_EPOCH_S <= value <= MAX_EPOCH_S:  # NaN fails too
        raise ValueError(f"backoff {attribute.name} must be a finite epoch second (got {value!r})")


def _step(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not 0 <= value <= 10_000:
        raise ValueError(f"backoff step must be in 0..10000 (got {value!r})")


@attrs.frozen(kw_only=True)
class Backoff:
    """Stay away until `until` (wall-clock epoch seconds). `step` climbs the ladder. Raises
    ValueError for a deadline or step out of bounds (one read back from a store, or published by
    another host, is checked like any other input)."""

    until: float = attrs.field(validator=_epoch)
    step: int = attrs.field(validator=_step)
    reason: Reason
    source: str  # where the duration came from: retry-after, reset header, daily window, ladder


def exhausted_reset_s(snapshot: RateLimitSnapshot) -> float | None:
    """Seconds until the latest reset among windows the headers show at zero remaining."""
    resets = [w.reset_s for w in snapshot.windows if w.remaining == 0 and w.reset_s is not None]
    return max(resets) if resets else None


def daily_exhausted(snapshot: RateLimitSnapshot) -> bool:
    if snapshot.exhausted_window_s is not None and snapshot.exhausted_window_s >= DAY_S:
        return True
    return any(w.remaining == 0 and (w.window_s or 0) >= DAY_S for w in snapshot.windows)


def backoff_for(
    reason: Reason,
    snapshot: RateLimitSnapshot,
    *,
    step: int,
    now: float,
    random: Callable[[], float],
    jitter: float = 0.1,
) -> Backoff:
    """The backoff to enter at wall time `now` after the `step`-th failure in a row (0-based)."""
    ladder = LADDERS[reason]
    if snapshot.retry_after_s is not None:
        base, source = snapshot.retry_after_s, "retry-after"
    elif (reset := exhausted_reset_s(snapshot)) is not None:
        base, source = reset, "reset header"
    else:
        base, source = ladder[min(step, len(ladder) - 1)], "ladder"
    if reason in ("rate_limited", "quota_exhausted") and daily_exhausted(snapshot):
        until_midnight = window_end("day", now) - now
        reset = exhausted_reset_s(snapshot)
        daily = reset if reset is not None and reset > base else until_midnight
        if daily > base:
            base, source = daily, "daily window"
    base = min(max(base, 0.0), MAX_WAIT_S)  # a snapshot read back from a store is bounded too
    extra = base * jitter * random() + min(1.0, base) * 0.05 * random()
    return Backoff(until=now + base + extra, step=step + 1, reason=reason, source=source)


def relax(step: int) -> int:
    """A backoff that expired without a fresh failure halves its step counter."""
    return step // 2

"""A circuit breaker: closed → open → half-open (one probe) → closed. Pure.

`breakers.py` keeps one per (lane, model) and one per lane.

Time is passed in as `now` (seconds on the caller's clock). Randomness (the cooldown jitter) comes
from an injectable `random` returning floats in [0, 1).

Only faults count: refused, reset, 5xx, garbage, the lane's own time cap. 429 and 402 belong to the
free-tier manager's backoff, and our own deadline firing is never the upstream's failure — a probe
cut by it is `release`d, so the breaker never sticks half-open.
"""

from __future__ import annotations

# lanes: pure
import random as _random
from collections import deque
from collections.abc import Callable
from typing import Literal

import attrs

from lanes._core.model.validators import above, at_least, non_negative, positive

State = Literal["closed", "open", "half_open"]
Verdict = Literal["success", "fault", "neutral"]


@attrs.frozen(kw_only=True)
class BreakerPolicy:
    """When a breaker opens and for how long. Durations in seconds."""

    #: consecutive faults that open it
    failures: int = attrs.field(default=3, validator=at_least(1))
    #: or this share of failed calls ...
    ratio: float = attrs.field(default=0.5, validator=above(0))
    #: ... over this window, seconds ...
    window_s: float = attrs.field(default=60.0, validator=positive)
    #: ... once the window holds this many calls
    min_calls: int = attrs.field(default=10, validator=at_least(1))
    #: the first open period, seconds
    cooldown_s: float = attrs.field(default=15.0, validator=non_negative)
    #: the cap of the growing open period, seconds (never below `cooldown_s`)
    # Kept short so that traffic returns to a preferred candidate within ~cooldown_max_s ×
    # (1 + jitter) of its recovery (22 s by default), one probe at a time.
    cooldown_max_s: float = attrs.field(default=20.0, validator=non_negative)
    #: each reopening multiplies the open period by this
    growth: float = attrs.field(default=2.0, validator=at_least(1))
    #: up to this share (0.1: +10 %) added at random to each open period
    jitter: float = attrs.field(default=0.1, validator=non_negative)
    #: this many of the lane's models with open breakers open the lane's own breaker
    lane_models: int = attrs.field(default=3, validator=at_least(1))

    @ratio.validator
    def _ratio(self, attribute: attrs.Attribute[float], value: float) -> None:
        if value > 1:
            raise ValueError(f"ratio: must be <= 1 (got {value:g}); it is a share of calls")


@attrs.frozen(kw_only=True)
class Permit:
    """Leave to send one request; `probe` when it is the half-open state's single probe."""

    probe: bool


@attrs.frozen(kw_only=True)
class BreakerStatistics:
    state: State
    consecutive_faults: int
    window_calls: int
    window_faults: int
    reopen_at: float | None
    opened_at: float | None  # when it last opened (None while closed)
    trips: int
    probe_in_flight: bool


class Breaker:
    """One breaker. Not thread-safe; one trio run owns it."""

    def __init__(
        self, policy: BreakerPolicy | None = None, *, random: Callable[[], float] = _random.random
    ) -> None:
        self.policy = policy or BreakerPolicy()
        self._random = random
        self._state: State = "closed"
        self._consecutive = 0
        self._window: deque[tuple[float, bool]] = deque()  # (time, faulted)
        self._reopen_at: float | None = None
        self._opened_at: float | None = None
        self._trips = 0  # reopenings since the last close; grows the cooldown
        self._probe_in_flight = False

    def state(self, now: float) -> State:
        if self._state == "open" and self._reopen_at is not None and now >= self._reopen_at:
            self._state = "half_open"
        return self._state

    def acquire(self, now: float) -> Permit | None:
        """A permit to send one request, or None while open (or while the one probe is out)."""
        state = self.state(now)
        if state == "closed":
            return Permit(probe=False)
        if state == "half_open" and not self._probe_in_flight:
            self._probe_in_flight = True
            return Permit(probe=True)
        return None

    def count(self, permit: Permit, verdict: Verdict, now: float) -> None:
        """Count the attempt a permit allowed. `neutral` (429, 402, our deadline) counts nothing."""
        if verdict == "neutral":
            self.release(permit)
            return
        if permit.probe:
            self._probe_in_flight = False
            if verdict == "success":
                self._close()
            else:
                self._open(now)
            return
        if self._state != "closed":
            return  # a straggler from before the breaker opened: its verdict is already stale
        self._window.append((now, verdict == "fault"))
        self._trim(now)
        if verdict == "success":
            self._consecutive = 0
            return
        self._consecutive += 1
        faults = sum(1 for _, faulted in self._window if faulted)
        p = self.policy
        over_ratio = len(self._window) >= p.min_calls and faults / len(self._window) >= p.ratio
        if self._consecutive >= p.failures or over_ratio:
            self._open(now)

    def release(self, permit: Permit) -> None:
        """Give back a permit whose attempt proved nothing (cancelled by our deadline, 429, 402)."""
        if permit.probe:
            self._probe_in_flight = False

    def statistics(self, now: float) -> BreakerStatistics:
        self._trim(now)
        state = self.state(now)
        return BreakerStatistics(
            state=state,
            consecutive_faults=self._consecutive,
            window_calls=len(self._window),
            window_faults=sum(1 for _, faulted in self._window if faulted),
            reopen_at=self._reopen_at if state != "closed" else None,
            opened_at=self._opened_at if state != "closed" else None,
            trips=self._trips,
            probe_in_flight=self._probe_in_flight,
        )

    def trip(self, now: float) -> None:
        """Open now (the lane breaker, when enough of its models' breakers opened at once)."""
        if self.state(now) == "closed":
            self._open(now)

    def _open(self, now: float) -> None:
        p = self.policy
        self._opened_at = now
        base = min(p.cooldown_s * p.growth**self._trips, max(p.cooldown_s, p.cooldown_max_s))
        self._reopen_at = now + base * (1.0 + p.jitter * self._random())
        self._trips += 1
        self._state = "open"
        self._consecutive = 0
        self._window.clear()

    def _close(self) -> None:
        self._state = "closed"
        self._reopen_at = None
        self._opened_at = None
        self._trips = 0
        self._consecutive = 0
        self._window.clear()

    def _trim(self, now: float) -> None:
        horizon = now - self.policy.window_s
        while self._window and self._window[0][0] < horizon:
            self._window.popleft()

"""A breaker per (lane, model), and one per lane that opens only on provider-wide evidence. Pure.

A lane serves many models, and one sick model must not darken its siblings: each model has its own
breaker, and a success on one model never resets another's fault count. The lane's own breaker
opens only on evidence about the provider itself:

- connection-level faults (refused, reset, DNS, TLS), counted across all of the lane's models —
  any answer from the provider, even a 5xx, proves it reachable and resets that count;
- `lane_models` of its models' breakers open (or half-open) at the same time.

An attempt needs a permit from both. While the lane breaker is half-open its single probe may go to
any model whose own breaker allows it, and that probe's fault of any kind reopens the lane.
"""

from __future__ import annotations

# lanes: pure
import random as _random
from collections.abc import Callable

import attrs

from lanes._core.policy.breaker import Breaker, BreakerPolicy, BreakerStatistics, Permit, Verdict


@attrs.frozen(kw_only=True)
class Pass:
    """Leave to send one request to `model`: the lane's permit and the model's."""

    model: str
    lane_permit: Permit
    model_permit: Permit


@attrs.frozen(kw_only=True)
class LaneBreakerStatistics:
    lane: BreakerStatistics
    models: dict[str, BreakerStatistics]


class LaneBreakers:
    """The breakers of one lane. Not thread-safe; one trio run owns it."""

    def __init__(
        self, policy: BreakerPolicy, *, random: Callable[[], float] = _random.random
    ) -> None:
        self.policy = policy
        self._random = random
        self.lane = Breaker(policy, random=random)
        self.models: dict[str, Breaker] = {}

    def model(self, model: str) -> Breaker:
        breaker = self.models.get(model)
        if breaker is None:
            breaker = self.models[model] = Breaker(self.policy, random=self._random)
        return breaker

    def acquire(self, model: str, now: float) -> Pass | None:
        """Permits from the lane's breaker and the model's, or None (see `refusal` for why)."""
        lane_permit = self.lane.acquire(now)
        if lane_permit is None:
            return None
        model_permit = self.model(model).acquire(now)
        if model_permit is None:
            self.lane.release(lane_permit)
            return None
        return Pass(model=model, lane_permit=lane_permit, model_permit=model_permit)

    def refusal(self, model: str, now: float) -> str:
        """Why `acquire` refuses `model` now, e.g. "breaker open (since 12 s)"."""
        for label, breaker in (("lane breaker", self.lane), ("breaker", self.models.get(model))):
            if breaker is None:
                continue
            stats = breaker.statistics(now)
            if stats.state == "open":
                since = (
                    f" (since {now - stats.opened_at:.0f} s)" if stats.opened_at is not None else ""
                )
                return f"{label} open{since}"
            if stats.state == "half_open" and stats.probe_in_flight:
                return f"{label} half-open, its one probe is out"
        return "breaker closed"

    def lane_refusal(self, now: float) -> str | None:
        """Why the lane's own breaker refuses every model now, or None."""
        reason = self.refusal("", now) if self.lane.state(now) != "closed" else ""
        return reason if reason.startswith("lane breaker") else None

    def is_open(self, model: str, now: float) -> bool:
        """True while `model` can not be sent anything (its breaker or the lane's is open)."""
        model_breaker = self.models.get(model)
        return self.lane.state(now) == "open" or (
            model_breaker is not None and model_breaker.state(now) == "open"
        )

    def count(
        self, granted: Pass, verdict: Verdict, now: float, *, connection: bool = False
    ) -> None:
        """Count the attempt `granted` allowed. `connection`: the fault was connection-level."""
        model_breaker = self.model(granted.model)
        model_breaker.count(granted.model_permit, verdict, now)
        lane_verdict: Verdict = verdict
        if verdict == "fault" and not connection and not granted.lane_permit.probe:
            # the provider answered: this model's trouble, not the provider's
            lane_verdict = "neutral"
        self.lane.count(granted.lane_permit, lane_verdict, now)
        if verdict == "fault" and model_breaker.state(now) != "closed":
            sick = sum(1 for b in self.models.values() if b.state(now) != "closed")
            if sick >= self.policy.lane_models:
                self.lane.trip(now)

    def release(self, granted: Pass) -> None:
        """Give both permits back: the attempt proved nothing (our deadline, a 429, a local
        error)."""
        self.models[granted.model].release(granted.model_permit)
        self.lane.release(granted.lane_permit)

    def model_statistics(self, model: str, now: float) -> BreakerStatistics:
        """`model`'s breaker as it stands (a model never sent anything has a closed one)."""
        breaker = self.models.get(model) or Breaker(self.policy)
        return breaker.statistics(now)

    def statistics(self, now: float) -> LaneBreakerStatistics:
        return LaneBreakerStatistics(
            lane=self.lane.statistics(now),
            models={m: b.statistics(now) for m, b in self.models.items()},
        )

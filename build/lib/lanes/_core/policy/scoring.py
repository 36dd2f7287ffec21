"""Ranking free candidates: reliability with honest uncertainty, time-decaying penalties, latency,
context and capability fit. Pure — every function takes `now` (seconds, any one clock).

Reliability from a model's outcomes: no data → the prior (0.5); fewer than `min_samples` →
shrunk toward the prior; otherwise the Wilson lower bound (z = 1.96) — so a model that is 1 for 1
can not outrank one that is 200 for 205. Recent 429s, faults and deadlines subtract penalties that
halve every `half_life_s`. A provider whose recent outcomes are mostly failures is *degraded*: all
its models' reliability is multiplied down.
"""

from __future__ import annotations

# lanes: pure
import difflib
import math
from collections import deque
from collections.abc import Mapping

import attrs

from lanes._core.model.validators import at_least


@attrs.frozen(kw_only=True)
class ScoringConfig:
    """`[scoring]` in config."""

    #: below this many outcomes a model's reliability is shrunk toward `prior`; from then on it is
    #: the Wilson lower bound
    min_samples: int = attrs.field(default=5, validator=at_least(1))
    #: the reliability of a model with no outcomes yet
    prior: float = 0.5
    #: the Wilson bound's z (1.96: 95 %), so a model that is 1 for 1 never outranks one that is
    #: 200 for 205
    z: float = 1.96
    #: the penalties of recent outcomes halve every this many seconds
    half_life_s: float = attrs.field(default=600.0, validator=at_least(1))
    #: taken off reliability for each recent `rate_limited`, `fault` and `deadline` outcome
    penalties: dict[str, float] = attrs.field(
        factory=lambda: {"rate_limited": 0.05, "fault": 0.1, "deadline": 0.05}
    )
    #: how reliability, latency, context fit and capability fit are combined into the score
    weights: dict[str, float] = attrs.field(
        factory=lambda: {"reliability": 0.5, "latency": 0.2, "context": 0.1, "capability": 0.2}
    )

    @penalties.validator
    @weights.validator
    def _known(self, attribute: attrs.Attribute[dict[str, float]], value: dict[str, float]) -> None:
        known = sorted(attribute.default.factory())  # type: ignore[union-attr]
        for key in value:
            if key not in known:
                near = difflib.get_close_matches(key, known, n=1)
                hint = f"did you mean {near[0]}?" if near else f"the keys are {', '.join(known)}"
                raise ValueError(f"{attribute.name}.{key}: unknown key; {hint}")

    #: the latency a model is scored against, seconds
    latency_ref_s: float = attrs.field(default=2.0, validator=at_least(0.001))
    #: a provider failing this share of its recent outcomes is degraded …
    degraded_ratio: float = 0.5
    #: … and its models' reliability is multiplied by this
    degraded_multiplier: float = 0.5
    #: about this share of jobs go to a healthy runner-up, or to an under-sampled model, among the
    #: next 16 of the plan, so the ranking does not ossify (the reply says so in
    #: `X-Lanes-Explored`, the audit marks it)
    explore_rate: float = attrs.field(default=0.05, validator=at_least(0))
    #: how close to the leader's score a runner-up must be to be explored
    explore_gap: float = attrs.field(default=0.15, validator=at_least(0))
    #: keep a multi-turn conversation on the model that served it while healthy, keeping provider
    #: prompt caches warm
    sticky: bool = True
    #: how long a conversation stays on its model, seconds
    sticky_ttl_s: float = attrs.field(default=3600.0, validator=at_least(0))


def wilson_lower(successes: int, n: int, z: float = 1.96) -> float:
    """The Wilson score interval's lower bound for `successes` out of `n` (0 when n is 0)."""
    if n <= 0:
        return 0.0
    p = successes / n
    denominator = 1 + z * z / n
    centre = p + z * z / (2 * n)
    margin = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, (centre - margin) / denominator)


def reliability(successes: int, n: int, config: ScoringConfig) -> float:
    """The prior with no data; below `min_samples` the Wilson bound shrunk toward the prior in
    proportion to the evidence (so more evidence never jumps past the bound at `min_samples`);
    from `min_samples` on, the Wilson lower bound itself."""
    if n <= 0:
        return config.prior
    bound = wilson_lower(successes, n, config.z)
    if n < config.min_samples:
        weight = n / config.min_samples
        return (1 - weight) * config.prior + weight * bound
    return bound


class Stats:
    """One candidate's outcomes: counts, a latency average, recent penalty events."""

    def __init__(self) -> None:
        self.successes = 0
        self.n = 0
        self.latency_s: float | None = None
        self.events: deque[tuple[float, str]] = deque(maxlen=64)

    def count(self, outcome: str, latency_s: float, now: float) -> None:
        if outcome in ("ok", "fault", "deadline", "rate_limited"):
            self.n += 1
            self.successes += outcome == "ok"
        if outcome == "ok":
            self.latency_s = (
                latency_s if self.latency_s is None else 0.8 * self.latency_s + 0.2 * latency_s
            )
        else:
            self.events.append((now, outcome))

    def penalty(self, now: float, config: ScoringConfig) -> float:
        return math.fsum(
            config.penalties.get(kind, 0.0) * 0.5 ** ((now - at) / config.half_life_s)
            for at, kind in self.events
            if now >= at
        )


def score(
    stats: Stats | None,
    *,
    now: float,
    config: ScoringConfig,
    degraded: bool = False,
    context_fit: float = 1.0,
    capability_fit: float = 1.0,
) -> float:
    """The candidate's ranking score (higher is better)."""
    stats = stats or Stats()
    base = base_score(
        stats,
        config=config,
        degraded=degraded,
        context_fit=context_fit,
        capability_fit=capability_fit,
    )
    return base - stats.penalty(now, config)


def base_score(
    stats: Stats,
    *,
    config: ScoringConfig,
    degraded: bool,
    context_fit: float,
    capability_fit: float,
) -> float:
    """The score before the recent penalties: what does not change with time."""
    w = config.weights
    rel = reliability(stats.successes, stats.n, config) * (
        config.degraded_multiplier if degraded else 1.0
    )
    latency = (
        0.5 if stats.latency_s is None else 1.0 / (1.0 + stats.latency_s / config.latency_ref_s)
    )
    return (
        w.get("reliability", 0) * rel
        + w.get("latency", 0) * latency
        + w.get("context", 0) * context_fit
        + w.get("capability", 0) * capability_fit
    )


def degraded_providers(
    recent: Mapping[str, deque[bool]], config: ScoringConfig, min_outcomes: int = 5
) -> set[str]:
    """Providers (lanes) whose recent outcomes fail at least `degraded_ratio` of the time."""
    return {
        lane
        for lane, outcomes in recent.items()
        if len(outcomes) >= min_outcomes
        and outcomes.count(False) / len(outcomes) >= config.degraded_ratio
    }


def pick_exploration(
    ranked: list[tuple[str, float, int]], config: ScoringConfig, draw: float
) -> str | None:
    """Which candidate key to explore, if any: `ranked` is (key, score, samples), best first; `draw`
    a uniform number in [0, 1). A healthy runner-up within `explore_gap` of the leader, or an
    under-sampled one, is chosen for about `explore_rate` of jobs."""
    if len(ranked) < 2 or draw >= config.explore_rate:
        return None
    leader = ranked[0][1]
    pool = [
        key
        for key, value, samples in ranked[1:]
        if leader - value <= config.explore_gap or samples < config.min_samples
    ]
    if not pool:
        return None
    return pool[int(draw / config.explore_rate * len(pool)) % len(pool)]

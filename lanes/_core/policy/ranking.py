"""What the dispatcher remembers to rank free candidates: outcomes per model, recent health per
provider, conversations kept on one model, and the exploration draw. Decisions are in scoring.py."""

from __future__ import annotations

import hashlib
import random
from collections import deque
from collections.abc import Callable, Sequence

from lanes._core.model.candidates import Candidate
from lanes._core.model.job import Job
from lanes._core.policy.needs import Needs
from lanes._core.policy.policy import fit
from lanes._core.policy.scoring import (
    ScoringConfig,
    Stats,
    base_score,
    degraded_providers,
    pick_exploration,
    score,
)

#: Candidates whose score before the penalties is kept (a catalog is bounded well below).
MAX_KEPT = 10_000


class Ranking:
    def __init__(self, config: ScoringConfig, rng: random.Random | None = None) -> None:
        self.config = config
        self.rng = rng or random.Random()
        self.stats: dict[str, Stats] = {}
        self.recent: dict[str, deque[bool]] = {}  # lane → recent outcomes (True = served)
        self.sticky: dict[str, tuple[str, float]] = {}  # conversation → (candidate key, when)
        self.explored = 0  # jobs that went to a runner-up on purpose
        self.explored_ok = 0
        self.scored = 0  # scores computed, all jobs (a plan scores groups, not every model)
        # per candidate key: what its score before the penalties was made of, and that score
        self._base: dict[str, tuple[tuple[object, ...], float]] = {}

    def explored_served(self) -> None:
        """A job sent to a runner-up on purpose was served by it."""
        self.explored_ok += 1

    def note(self, candidate: Candidate, outcome: str, latency_s: float, now: float) -> None:
        if outcome not in ("ok", "fault", "deadline", "rate_limited"):
            return
        self.stats.setdefault(candidate.key, Stats()).count(outcome, latency_s, now)
        self.recent.setdefault(candidate.lane, deque(maxlen=20)).append(outcome == "ok")

    def scores(
        self,
        candidates: Sequence[Candidate],
        needs: Needs,
        now: float,
        *,
        degraded: set[str] | None = None,
    ) -> dict[str, float]:
        """Each candidate's score for a job with `needs`, from its own outcomes."""
        if degraded is None:
            degraded = degraded_providers(self.recent, self.config)
        return {
            c.key: self._score(c, self.stats.get(c.key), needs, now, degraded) for c in candidates
        }

    def cold_score(
        self, candidate: Candidate, needs: Needs, now: float, degraded: set[str]
    ) -> float:
        """The score of a candidate with no outcomes of its own, shaped like `candidate`."""
        return self._score(candidate, None, needs, now, degraded)

    def warm(self) -> list[str]:
        """The candidate keys with outcomes of their own."""
        return list(self.stats)

    def _score(
        self, c: Candidate, stats: Stats | None, needs: Needs, now: float, degraded: set[str]
    ) -> float:
        self.scored += 1
        context, capability = fit(c, needs)
        if stats is None:
            return score(
                None,
                now=now,
                config=self.config,
                degraded=c.lane in degraded,
                context_fit=context,
                capability_fit=capability,
            )
        # what the score is made of but time: the same as last time (most candidates, most jobs:
        # only the one that served has new outcomes), the same score before the penalties
        made_of = (
            stats.successes,
            stats.n,
            stats.latency_s,
            context,
            capability,
            c.lane in degraded,
        )
        kept = self._base.get(c.key)
        if kept is not None and kept[0] == made_of:
            base = kept[1]
        else:
            base = base_score(
                stats,
                config=self.config,
                degraded=made_of[5],
                context_fit=context,
                capability_fit=capability,
            )
            if len(self._base) >= MAX_KEPT:
                self._base.clear()
            self._base[c.key] = (made_of, base)
        return base - stats.penalty(now, self.config)

    def degraded(self) -> set[str]:
        """The lanes whose recent outcomes are mostly failures (see `degraded_providers`)."""
        return degraded_providers(self.recent, self.config)

    def remembered(self, job: Job, now: float) -> str | None:
        """The candidate a multi-turn conversation stays on, while its memory is fresh."""
        if not self.config.sticky or not any(m.get("role") == "assistant" for m in job.messages):
            return None
        found = self.sticky.get(self.conversation(job))
        return found[0] if found and now - found[1] <= self.config.sticky_ttl_s else None

    @staticmethod
    def conversation(job: Job) -> str:
        """A key for a multi-turn conversation: the client, the system prompt and the first user
        turn."""
        system = next((m.get("content") for m in job.messages if m.get("role") == "system"), "")
        first = next((m.get("content") for m in job.messages if m.get("role") == "user"), "")
        raw = f"{job.client}\x00{system!r}\x00{first!r}".encode()
        return hashlib.sha256(raw).hexdigest()

    def remember(self, job: Job, key: str, now: float) -> None:
        if self.config.sticky:
            if len(self.sticky) > 10_000:
                self.sticky.pop(next(iter(self.sticky)))
            self.sticky[self.conversation(job)] = (key, now)

    def front(
        self,
        ordered: Sequence[Candidate],
        job: Job,
        scores: dict[str, float],
        now: float,
        healthy: Callable[[Candidate], bool],
    ) -> tuple[list[Candidate], str | None, bool]:
        """The order to try: a multi-turn conversation's model first while healthy (sticky), else,
        for about `explore_rate` of jobs, a close runner-up or an under-sampled model first.
        Returns (order, explored key or None, sticky)."""
        ordered = list(ordered)
        # the free leader, and only then — when the draw says this job may explore — the rest of
        # the healthy free candidates: most jobs look at one candidate's health, not at all of them
        leader = next((c for c in ordered if c.tier == "free" and healthy(c)), None)
        if leader is None:
            return ordered, None, False
        remembered = self.remembered(job, now)
        if remembered:
            chosen = next(
                (c for c in ordered if c.key == remembered and c.tier == "free" and healthy(c)),
                None,
            )
            if chosen is not None:
                return _to_front(ordered, leader, chosen), None, True
        draw = self.rng.random()
        if draw >= self.config.explore_rate:  # `pick_exploration` would pick nothing
            return ordered, None, False
        free = [c for c in ordered if c.tier == "free" and healthy(c)]
        ranked = [(c.key, scores.get(c.key, 0.0), self.stats.get(c.key, Stats()).n) for c in free]
        pick = pick_exploration(ranked, self.config, draw)
        if pick is None:
            return ordered, None, False
        self.explored += 1
        chosen = next(c for c in free if c.key == pick)
        return _to_front(ordered, free[0], chosen), pick, False


def _to_front(ordered: list[Candidate], leader: Candidate, chosen: Candidate) -> list[Candidate]:
    """Move `chosen` just before the current free leader (local candidates keep their place)."""
    if chosen is leader:
        return ordered
    rest = [c for c in ordered if c is not chosen]
    index = rest.index(leader)
    return rest[:index] + [chosen] + rest[index:]

"""An `auto` job's plan over the pool, drawn lazily. Pure.

The plan is not filtered, scored and sorted whole for every job: each group of the pool (candidates
the filters and the ranking's fit see alike) is checked and scored once, a candidate with outcomes
of its own (a "warm" one) is scored on its own, and the groups are merged lazily, in exactly
`make_plan`'s order — tier, the request class's preferences, score best first, config order. What a
job costs grows with the groups and the candidates it actually reaches, not with the models that can
not serve it.

```python
plan = AutoPlan(pool, job, policy, needs=needs, keep=keep, warm=warm_scores, cold=cold_score)
queue = Queue(plan)            # pop(), peek(n), drop_lane(lane, tier)  (see plan_queue.py)
```
"""

from __future__ import annotations

# lanes: pure
import heapq
from collections import deque
from collections.abc import Callable, Iterator, Mapping

from lanes._core.model.candidates import Candidate
from lanes._core.model.job import Job
from lanes._core.policy.needs import Needs, clamped
from lanes._core.policy.policy import PolicyConfig, request_class
from lanes._core.policy.pool import TIERS, Group, Pool, group_unfit


class AutoPlan:
    """An `auto` job's plan over `pool`, drawn lazily in `make_plan`'s order.

    `keep(candidate)`: the walk's own filter (excluded keys, prefill); `warm()`: the scores of the
    free candidates the ranking has outcomes for (asked when the free tier is reached);
    `cold(candidate)`: the score of a free candidate with none (asked once per group, for its first
    member). `removed` lists the unfit groups and why.
    """

    def __init__(
        self,
        pool: Pool,
        job: Job,
        policy: PolicyConfig,
        *,
        needs: Needs,
        keep: Callable[[Candidate], bool],
        warm: Callable[[], Mapping[str, float]],
        cold: Callable[[Candidate], float],
    ) -> None:
        self.privacy: str = job.privacy if job.privacy != "any" else policy.privacy
        self.request_class = request_class(
            job, policy.long_context_tokens, input_tokens=needs.input_tokens
        )
        self._pool, self._keep, self._warm_of, self._cold = pool, keep, warm, cold
        self._needs = needs
        self._left_out: set[str] = set()
        self._dropped: set[tuple[str, str]] = set()
        self.removed: list[tuple[Group, str]] = []
        self._fit: dict[str, list[Group]] = {tier: [] for tier in TIERS}
        self._fit_ids: set[int] = set()
        for group in pool.groups:
            reason = group_unfit(group, job, needs, self.privacy, policy)
            if reason:
                self.removed.append((group, reason))
            else:
                self._fit[group.first.tier].append(group)
                self._fit_ids.add(id(group))
        preferred = policy.classes.get(self.request_class, [])
        self._first: dict[str, list[Candidate]] = {tier: [] for tier in TIERS}
        for key in preferred:
            c = pool.by_key.get(key)
            if c is not None and c not in self._first[c.tier] and self.contains(c):
                self._first[c.tier].append(c)
        self._preferred = {c.key for tier in TIERS for c in self._first[tier]}
        self._tiers = iter(TIERS)
        self._tier = ""
        self._warm: Mapping[str, float] = {}  # the free tier's, once it is reached
        self._scores: dict[int, float] = {}  # a group's score (by its id), asked once
        self._ahead: deque[Candidate] = deque()  # the tier's preferred candidates, still to draw
        # (clamped: holds less than the whole output cap, -score, position, stream)
        self._heap: list[tuple[bool, float, int, int]] = []
        self._streams: list[tuple[Group, int, float]] = []  # group, next member, its score

    def _clamped(self, candidate: Candidate) -> bool:
        """Whether `candidate` holds less than the whole output cap asked (drawn after those that
        hold it all, within a tier, as in `make_plan`)."""
        return clamped(candidate, self._needs)

    @property
    def fits_none(self) -> bool:
        """Whether no group of the pool fits the job (every one was removed)."""
        return not self._fit_ids

    def contains(self, candidate: Candidate) -> bool:
        """Whether `candidate` is in this plan (fits, and the walk keeps it)."""
        group = self._pool.group_of.get(candidate.key)
        return (
            group is not None
            and id(group) in self._fit_ids
            and candidate.key not in self._left_out
            and self._keep(candidate)
        )

    def leave_out(self, key: str) -> None:
        """Do not draw `key` (the walk took it out of order)."""
        self._left_out.add(key)

    def score_of(self, candidate: Candidate) -> float:
        """A free candidate's score in this plan: its own, or its group's."""
        if candidate.key in self._warm:
            return self._warm[candidate.key]
        group = self._pool.group_of[candidate.key]
        if id(group) not in self._scores:
            self._scores[id(group)] = self._cold(group.first)
        return self._scores[id(group)]

    def next(self) -> Candidate | None:
        while True:
            while self._ahead:
                c = self._ahead.popleft()
                if (c.lane, c.tier) not in self._dropped and c.key not in self._left_out:
                    return c
            found = self._pop_stream()
            if found is not None:
                return found
            tier = next(self._tiers, None)
            if tier is None:
                return None
            self._open_tier(tier)

    def _open_tier(self, tier: str) -> None:
        self._tier = tier
        self._ahead = deque(self._first[tier])
        self._heap, self._streams = [], []
        if tier == "free" and self._fit[tier]:
            self._warm = self._warm_of()
        for group in self._fit[tier]:
            score = self.score_of(group.first) if tier == "free" else 0.0
            self._streams.append((group, 0, score))
            self._advance(len(self._streams) - 1)
        for key, score in self._warm.items():  # each warm one at its own score, a stream each
            c = self._pool.by_key.get(key)
            if c is not None and c.tier == tier and key not in self._preferred and self.contains(c):
                position = self._pool.position[key]
                self._streams.append((Group(members=((position, c),)), 1, score))
                heapq.heappush(
                    self._heap, (self._clamped(c), -score, position, len(self._streams) - 1)
                )

    def _drawn_later(self, c: Candidate) -> bool:
        """Whether a group's member is drawn from the group's stream (not from a stream of its own
        or the preferred, nor left out by the walk)."""
        return (
            c.key not in self._warm
            and c.key not in self._preferred
            and c.key not in self._left_out
            and self._keep(c)
        )

    def _advance(self, stream: int) -> None:
        """Push `stream`'s next member that the plan draws."""
        group, i, score = self._streams[stream]
        while i < len(group.members):
            position, c = group.members[i]
            i += 1
            if self._drawn_later(c):
                heapq.heappush(self._heap, (self._clamped(c), -score, position, stream))
                break
        self._streams[stream] = (group, i, score)

    def _pop_stream(self) -> Candidate | None:
        while self._heap:
            _, _, position, stream = heapq.heappop(self._heap)
            c = self._pool.candidates[position]
            if (c.lane, c.tier) in self._dropped:
                continue
            self._advance(stream)
            if c.key not in self._left_out:
                return c
        return None

    def drop_lane(self, lane: str, tier: str) -> Iterator[Candidate]:
        """Draw nothing more of `lane`'s `tier`; yields what is left of it there, in config order
        (lazily: the caller takes as many as it records)."""
        self._dropped.add((lane, tier))
        if tier != self._tier:
            return self._unopened(lane, tier)
        first = [c for c in self._ahead if c.lane == lane]
        heads = [(p, s) for _, _, p, s in self._heap if self._pool.candidates[p].lane == lane]

        def rest(position: int, stream: int) -> Iterator[tuple[int, Candidate]]:
            group, i, _ = self._streams[stream]
            yield position, self._pool.candidates[position]
            yield from (m for m in group.members[i:] if self._drawn_later(m[1]))

        def everything() -> Iterator[Candidate]:
            yield from first
            merged = heapq.merge(*(rest(p, s) for p, s in sorted(heads)), key=lambda m: m[0])
            yield from (c for _, c in merged if c.key not in self._left_out)

        return everything()

    def _unopened(self, lane: str, tier: str) -> Iterator[Candidate]:
        """What `drop_lane` yields of a tier not reached yet (nothing of one already passed)."""
        if self._tier and TIERS.index(tier) < TIERS.index(self._tier):
            return
        yield from (c for c in self._first[tier] if c.lane == lane)
        groups = [g.members for g in self._fit[tier] if g.first.lane == lane]
        for _, c in heapq.merge(*groups, key=lambda m: m[0]):
            if c.key not in self._preferred and c.key not in self._left_out and self._keep(c):
                yield c

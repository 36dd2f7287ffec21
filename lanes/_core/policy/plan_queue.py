"""The candidates a walk has still to try, drawn from a source as it asks. Pure."""

from __future__ import annotations

# lanes: pure
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

from lanes._core.model.candidates import Candidate


class CandidateSource(Protocol):
    """Where a `Queue` draws its candidates, in the order to try."""

    def next(self) -> Candidate | None: ...
    def drop_lane(self, lane: str, tier: str) -> Iterator[Candidate]: ...
    def leave_out(self, key: str) -> None: ...


class ListSource:
    """A plan already in order (an alias's, a model's: short lists), as a `CandidateSource`."""

    def __init__(self, candidates: Iterable[Candidate]) -> None:
        self._left: deque[Candidate] = deque(candidates)
        self._left_out: set[str] = set()

    def next(self) -> Candidate | None:
        while self._left:
            c = self._left.popleft()
            if c.key not in self._left_out:
                return c
        return None

    def drop_lane(self, lane: str, tier: str) -> Iterator[Candidate]:
        dropped = [c for c in self._left if c.lane == lane and c.tier == tier]
        self._left = deque(c for c in self._left if not (c.lane == lane and c.tier == tier))
        return iter(dropped)

    def leave_out(self, key: str) -> None:
        self._left_out.add(key)


class Queue:
    """The candidates still to try, drawn from a `CandidateSource` as the walk asks: `pop()` the
    next, `peek(n)` look ahead, `put_ahead()` reorder what was looked at."""

    def __init__(self, source: CandidateSource) -> None:
        self._source = source
        self._ahead: deque[Candidate] = deque()

    def peek(self, n: int) -> list[Candidate]:
        while len(self._ahead) < n:
            c = self._source.next()
            if c is None:
                break
            self._ahead.append(c)
        return list(self._ahead)[:n]

    def __bool__(self) -> bool:
        return bool(self.peek(1))

    def pop(self) -> Candidate:
        if not self.peek(1):
            raise IndexError("pop from an empty plan")
        return self._ahead.popleft()

    def put_ahead(self, order: Sequence[Candidate], looked_at: int) -> None:
        """Replace the first `looked_at` candidates with `order`; a candidate of `order` from
        beyond them is not drawn again."""
        looked = {c.key for c in list(self._ahead)[:looked_at]}
        rest = list(self._ahead)[looked_at:]
        for c in order:
            if c.key not in looked:
                self._source.leave_out(c.key)
        keys = {c.key for c in order}
        self._ahead = deque([*order, *(c for c in rest if c.key not in keys)])

    def drop_lane(self, lane: str, tier: str) -> Iterator[Candidate]:
        """Nothing more of `lane`'s `tier`; yields what is left of it (the looked-at first)."""
        ahead = [c for c in self._ahead if c.lane == lane and c.tier == tier]
        self._ahead = deque(c for c in self._ahead if not (c.lane == lane and c.tier == tier))
        rest = self._source.drop_lane(lane, tier)
        keys = {c.key for c in ahead}

        def everything() -> Iterator[Candidate]:
            yield from ahead
            yield from (c for c in rest if c.key not in keys)

        return everything()

"""Work that can wait, still to do in this process — and what it means for an interactive job.

Batches (the sidecar's queue, the library's `submit_batch`) say here how many items each has left.
While any has (and `[batch] spare` is on), an interactive job tries its free candidates in the
order that spares them: first those a batch item may not use for the rest of the day (their day
used up to the share `[batch] headroom` keeps for interactive work) — a request there costs the
batches nothing — then those with the least of their day left to batch items (the sooner one is
used up, the sooner interactive work may go there at no cost), the longest kept off first among
equals (a minute's share kept). Candidates it may not use now follow, in their order; every other
candidate keeps its place. With nothing left to do, nothing changes.
"""

from __future__ import annotations


class Backlog:
    def __init__(self, headroom: float, *, spare: bool = True) -> None:
        """`headroom`: the share of every free quota batch items leave to interactive work;
        `spare` (`[batch] spare`): whether interactive jobs are ordered to spare them."""
        self.headroom = headroom
        self._spare = spare
        self._left: dict[str, int] = {}

    def left(self, source: str, items: int) -> None:
        """`source` (a batch queue, a library batch) has `items` left to serve (0: done)."""
        if items > 0:
            self._left[source] = items
        else:
            self._left.pop(source, None)

    @property
    def items(self) -> int:
        """Items left to serve, over every source."""
        return sum(self._left.values())

    @property
    def spared(self) -> bool:
        """Whether interactive jobs are ordered to spare batches now: items are left, and
        `[batch] spare` is on."""
        return self._spare and bool(self._left)

"""Work that can wait, still to do in this process — and what it means for an interactive job.

Batches (the sidecar's queue, the library's `submit_batch`) say here how many items each has left.
While any has, an interactive job tries first the free candidates whose quota a batch item may not
use now: the share `[batch] headroom` keeps for interactive work (a quota the batch has used up to
that share), the ones the batch is kept off longest first — a day's before a minute's. Such a
request costs the batch nothing, or less, where another free candidate would take a request the
batch still needs. The rest keep their order; with nothing left to do, nothing changes.
"""

from __future__ import annotations


class Backlog:
    def __init__(self, headroom: float) -> None:
        """`headroom`: the share of every free quota batch items leave to interactive work."""
        self.headroom = headroom
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

"""The waiting room: jobs that asked to wait for a free quota (`X-Lanes-Max-Wait`) wait here.

It is bounded — waiting jobs per client, in all, and their bodies' bytes in all (`[policy]`
`waiting_per_client`, `waiting_jobs`, `waiting_mb`); a job that finds it full is answered as it
would have been without the header (429 with the exact Retry-After). It is fair: jobs whose quota
reopens at the same moment start again in turns — every client's earliest deadline first, then
every client's next — so one client's burst does not take a reopened quota from the others. A
job's place is given back on every exit, its client leaving included. Work that can wait (the
batch runner) looks at `waiting` and holds back its items while an interactive job waits.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import attrs
import trio

from lanes._core.policy.policy import PolicyConfig


class RoomFull(Exception):
    """No place: too many jobs (this client's, or all) or bytes already wait."""


@attrs.define(eq=False)
class Ticket:
    """One waiting job's place: its client, deadline (trio time), size, and — while it sleeps —
    the moment it starts again (None: not sleeping)."""

    client: str
    deadline_at: float
    size: int
    seq: int
    due: float | None = None


class WaitingRoom:
    def __init__(self, policy: Callable[[], PolicyConfig]) -> None:
        """`policy`: the policy in force, whose `waiting_*` caps are read at every entry."""
        self._policy = policy
        self._tickets: dict[int, Ticket] = {}
        self._bytes = 0
        self._seq = itertools.count()
        self._moved = trio.Event()  # set (and replaced) whenever a ticket starts or leaves
        self._started: Counter[str] = Counter()  # jobs each client started in this burst

    @property
    def waiting(self) -> int:
        """Jobs waiting now."""
        return len(self._tickets)

    @contextmanager
    def place(self, client: str, deadline_at: float, size: int) -> Iterator[Ticket]:
        """A place for one job until the block ends, or RoomFull."""
        policy = self._policy()
        mine = sum(1 for t in self._tickets.values() if t.client == client)
        if (
            mine >= policy.waiting_per_client
            or len(self._tickets) >= policy.waiting_jobs
            or self._bytes + size > policy.waiting_mb * 1_000_000
        ):
            raise RoomFull(client)
        ticket = Ticket(client, deadline_at, size, next(self._seq))
        self._tickets[ticket.seq] = ticket
        self._bytes += size
        try:
            yield ticket
        finally:
            del self._tickets[ticket.seq]
            self._bytes -= size
            self._moved.set()
            self._moved = trio.Event()

    async def wait(self, ticket: Ticket, pause_s: float) -> None:
        """Sleep `pause_s`, then wait for the turn among the jobs due at the same moment (or
        earlier). Cancelled with the job."""
        ticket.due = trio.current_time() + pause_s
        try:
            await trio.sleep_until(ticket.due)
            while (moved := self._ahead_of(ticket)) is not None:
                await moved.wait()
            self._started[ticket.client] += 1
        finally:
            ticket.due = None
            if not any(t.due is not None for t in self._tickets.values()):
                self._started.clear()  # the burst is over
            self._moved.set()
            self._moved = trio.Event()

    def _ahead_of(self, ticket: Ticket) -> trio.Event | None:
        """What to wait on while a job due no later goes first (by `_turns`), else None."""
        now = trio.current_time()
        due = [t for t in self._tickets.values() if t.due is not None and t.due <= now]
        turns = _turns(due, self._started)
        mine = turns[ticket.seq]
        if any(turns[t.seq] < mine for t in due):
            return self._moved
        return None


def _turns(tickets: list[Ticket], started: Counter[str]) -> dict[int, tuple[int, float, int]]:
    """The order of the tickets due now: rounds across clients (every client's earliest
    deadline, then every client's next — counting the jobs each `started` in this burst), then
    deadline, then arrival."""
    by_client: dict[str, list[Ticket]] = {}
    for t in sorted(tickets, key=lambda t: (t.deadline_at, t.seq)):
        by_client.setdefault(t.client, []).append(t)
    return {
        t.seq: (started[t.client] + rank, t.deadline_at, t.seq)
        for queue in by_client.values()
        for rank, t in enumerate(queue)
    }

"""One probe per cold scope: while nothing proves a free model serving (first use, or a backoff just
ended), one job sends a request and the others wait for its answer — single-flight within this
process, and across processes through a lease in the store: a row in the host's SQLite file, or a
key in Redis for several hosts. So a closed door gets one knock from the whole host (or fleet)
rather than one per process.

A probe holds the others only as long as it must: a provider refuses (a rate limit, a model gone,
a bad key) before it works on a request, so once the probe's request has been handed to the
operating system whole (the connection made, TLS done, its body written to the socket) and the
lane's `probe_quiet_s` passed with no answer — or once it answered: its whole answer, or a
stream's first chunk — the jobs waiting here go beside it: a whole answer to a cold model costs
one answer's time, not two. A refusal within the quiet time keeps them, and they see the backoff
it wrote. What the socket's buffers still hold is not yet at the provider: on a slow uplink a
large probe may still be on its way when the quiet time ends (raise `probe_quiet_s` there).

A job that finds another process's lease waits for its answer: told by a published event (Redis),
or asking the store again every `store.lease_poll_s` (SQLite) — the holder writes the backoff its
probe caused in the same transaction that releases the lease, so the next look sees the door
closed. The wait ends at the lane's `first_token_s` or the job's deadline, like a wait on a probe of
this process; a lease whose holder died lapses at its expiry.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Literal, Protocol

import trio

from lanes._core.freetier.manager import FreeTierManager
from lanes._core.model.clocks import EpochTime
from lanes._core.model.record import JobRecord
from lanes._core.state.backend import STORE_ERRORS, Backend, call
from lanes._core.state.leases import ProbeLeases
from lanes._core.upstream.lane import OpenAICompatibleLane

log = logging.getLogger("lanes")


class LeaseStore(Backend, ProbeLeases, Protocol):
    """What the probes need of the state store: its leases, and how a call reaches it."""


#: what `Probes.claim` tells a job: True — probe it; False — another probe answered, look again;
#: "beside" — the probe is on its way past its quiet time, go beside it; None — no answer in time
Claim = Literal[True, False, "beside"] | None


class _Flight:
    """This process's probe of one scope: when the jobs waiting for it may go without its
    answer (`quiet_at`, trio time: never before its request has left — told by the upstream
    client's connection trace, so a slow connect or TLS handshake counts no quiet time), and
    whether it answered."""

    def __init__(self) -> None:
        self.quiet_at = math.inf
        self.answered = False
        self._news = trio.Event()

    def sent(self, quiet_s: float) -> None:
        """The probe leaves now: the waiters may go `quiet_s` from now."""
        self.quiet_at = trio.current_time() + quiet_s
        self._tell()

    def answer(self) -> None:
        self.answered = True
        self._tell()

    def _tell(self) -> None:
        self._news.set()
        self._news = trio.Event()

    async def wait(self, until: float) -> Claim:
        """Wait for the probe's answer, or its quiet time, until `until`."""
        while not self.answered:
            now = trio.current_time()
            if now >= until:
                return None
            if now >= self.quiet_at:
                return "beside"
            with trio.move_on_at(min(until, self.quiet_at)):
                await self._news.wait()
        return False


class Probes:
    def __init__(
        self,
        store: LeaseStore,
        manager: FreeTierManager,
        now_wall: Callable[[], EpochTime],
        nudge: Callable[[], None],
    ) -> None:
        self._store = store
        self._manager = manager
        self._now = now_wall
        self._nudge = nudge  # run the state sync now: the other hosts wait for this probe's answer
        self._local: dict[str, _Flight] = {}  # scope → this process's probe of it
        self._remote: dict[str, trio.Event] = {}  # scope → set when another host's probe answered

    async def claim(self, scope: str, lane: OpenAICompatibleLane, record: JobRecord) -> Claim:
        """True: this job probes `scope` (then `release` it). False: another probe answered
        meanwhile — look again. "beside": this process's probe has been on its way for the lane's
        `probe_quiet_s` with no refusal — send beside it. None: it did not answer within the
        lane's `first_token_s` (or our deadline)."""
        flight = self._local.get(scope)
        until = min(record.deadline_at, trio.current_time() + lane.config.first_token_s)
        if flight is None:
            flight = self._local[scope] = _Flight()
            leased: bool | None = False
            try:
                leased = await self._lease(scope, lane, until)
            finally:
                if not leased:  # another process probed it (look again), gave up, or cancelled
                    self.release(scope)
            return leased
        return await flight.wait(until)

    async def _lease(self, scope: str, lane: OpenAICompatibleLane, until: float) -> bool | None:
        """Only one process probes a cold scope: True when this one may. Otherwise wait for the
        other's answer — then False (look again) — until `until` (then None). A store that can not
        be reached fails open: the local single-flight decides."""
        if not self._store.up:
            return True
        ttl_s = max(lane.config.attempt_timeout_s, lane.config.first_token_s) + 1.0
        while True:
            try:
                lease = await call(self._store, self._store.probe_lease, scope, ttl_s, self._now())
            except STORE_ERRORS:
                return True
            if lease is True:
                return True
            if lease is not False:  # another process's backoff, written with its answer
                self._manager.merge_backoffs([(scope, lease)])
                return False
            waiting = self._remote.setdefault(scope, trio.Event())
            with trio.move_on_at(min(until, trio.current_time() + self._store.lease_poll_s)):
                await waiting.wait()
                return False
            if trio.current_time() >= until:
                return None

    def sent(self, scope: str, quiet_s: float) -> None:
        """This process's probe of `scope` has left (its body written): the jobs waiting for it
        go beside it `quiet_s` from now, unless it answers first."""
        flight = self._local.get(scope)
        if flight is not None and flight.quiet_at == math.inf:
            flight.sent(quiet_s)

    def remote_answered(self, scope: str) -> None:
        """Another host's probe of `scope` answered: wake the jobs here that wait for it."""
        if (waiting := self._remote.pop(scope, None)) is not None:
            waiting.set()

    def release(self, scope: str | None) -> None:
        """The probe of `scope` answered (or was abandoned): wake the local waiters, and hand the
        lease back together with the backoff it caused. Never raises: a lease that can not be
        handed back lapses at its expiry."""
        if scope is None or (flight := self._local.pop(scope, None)) is None:
            return
        flight.answer()
        backoff = self._manager.backoff(scope)  # written before the lease is released
        live = backoff if backoff is not None and backoff.until > self._now() else None
        try:
            self._store.probe_done(scope, self._manager.confirmed(scope), live)
        except STORE_ERRORS as exc:
            log.warning(
                "probe of %s: the lease could not be handed back (%s); it lapses", scope, exc
            )
        if self._store.shared:
            self._nudge()

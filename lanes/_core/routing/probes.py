"""One probe per cold scope: while nothing proves a free model serving (first use, or a backoff just
ended), one job sends a request and the others wait for its answer — single-flight within this
process, and across hosts through a lease in a shared store (Redis), so a closed door gets one knock
from the whole fleet rather than one per host.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from lanes._core.clocks import EpochTime
from lanes._core.routing.record import JobRecord
from lanes._core.state.store import STORE_ERRORS, Store, call
from lanes._core.upstream.lane import OpenAICompatibleLane
from lanes.freetier.manager import FreeTierManager


class Probes:
    def __init__(
        self,
        store: Store,
        manager: FreeTierManager,
        now_wall: Callable[[], EpochTime],
        nudge: Callable[[], None],
    ) -> None:
        self._store = store
        self._manager = manager
        self._now = now_wall
        self._nudge = nudge  # run the state sync now: the other hosts wait for this probe's answer
        self._local: dict[str, trio.Event] = {}  # scope → set when this process's probe answered
        self.remote: dict[
            str, trio.Event
        ] = {}  # scope → set when another host's probe answered (see Sharing)

    async def claim(self, scope: str, lane: OpenAICompatibleLane, record: JobRecord) -> bool | None:
        """True: this job probes `scope` (then `release` it). False: another probe answered
        meanwhile — look again. None: it did not answer within the lane's `first_token_s` (or our
        deadline)."""
        event = self._local.get(scope)
        if event is None:
            self._local[scope] = trio.Event()
            leased = False
            try:
                leased = await self._lease(scope, lane, record)
            finally:
                if (
                    not leased
                ):  # another host probed it (look again with what it learned), or cancelled
                    self.release(scope)
            return leased
        with trio.move_on_at(
            min(record.deadline_at, trio.current_time() + lane.config.first_token_s)
        ):
            await event.wait()
            return False
        return None

    async def _lease(self, scope: str, lane: OpenAICompatibleLane, record: JobRecord) -> bool:
        """With a store shared between hosts, only one host probes a cold scope: True when this one
        may. Otherwise wait for the other host's answer (published), its lease to lapse, or our
        deadline. A store that can not be reached fails open: the local single-flight decides."""
        if not self._store.shared or not self._store.up:
            return True
        ttl_s = max(lane.config.attempt_timeout_s, lane.config.first_token_s) + 1.0
        try:
            lease = await call(self._store, self._store.probe_lease, scope, ttl_s)
        except STORE_ERRORS:
            return True
        if lease is True:
            return True
        if lease is not False:  # another host's backoff, written before we heard of it
            self._manager.merge_backoffs([(scope, lease)])
            return False
        waiting = self.remote.setdefault(scope, trio.Event())
        with trio.move_on_at(min(record.deadline_at, trio.current_time() + ttl_s)):
            await waiting.wait()
        return False

    def remote_answered(self, scope: str) -> None:
        """Another host's probe of `scope` answered: wake the jobs here that wait for it."""
        if (waiting := self.remote.pop(scope, None)) is not None:
            waiting.set()

    def release(self, scope: str | None) -> None:
        """The probe of `scope` answered (or was abandoned): wake the local waiters; with a shared
        store, hand the lease back together with the backoff it caused."""
        if scope is None or (event := self._local.pop(scope, None)) is None:
            return
        event.set()
        if self._store.shared:
            backoff = self._manager.backoffs.get(scope)  # written before the lease is released
            live = backoff if backoff is not None and backoff.until > self._now() else None
            self._store.probe_done(scope, scope in self._manager.confirmed, live)
            self._nudge()

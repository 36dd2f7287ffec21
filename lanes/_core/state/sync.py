"""Keeps the dispatcher and the store in step: flush what changed, take what others wrote.

Every half second (sooner when a backoff, a kill switch or a probe result must reach the other
hosts) the pending counts, spend, backoffs, snapshots, audit rows and queued writes go to the store,
and the totals other processes wrote come back into the local view that every routing decision
reads. With SQLite the calls run inline (see `store.call`); with Redis they run in a worker thread,
and a second task applies what other hosts publish as it arrives. Each round ends with this
process's beat (`Beats`): its configured paid terms and its view of the clock, answered with the
store's terms and clock (see `terms.py`); a graceful exit withdraws its announcement.

Neither task can die. A store that can not be reached is one log line per failure streak: the rows
wait for the next try — in bounded queues (usage coalesced by key, ended windows and expired
backoffs dropped, audit rows capped by the journal) — quotas and backoffs carry on from the local
view, and the paid ledger stays closed (see `Ledger.reserve`) until a sync succeeds again. A batch
the store *refuses* — any other exception, or a shared store that answered the sync's first call
and then failed the same batch three times — is a poison batch: dropped and counted, never retried
for ever. Every failure is reported to the task's `TaskHealth` (`/ready`, `/metrics`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import trio

from lanes._core.freetier.backoff import Backoff
from lanes._core.freetier.manager import FreeTierManager
from lanes._core.runtime.tasks import TaskHealth
from lanes._core.state.store import (
    STORE_ERRORS,
    ApprovalRecord,
    LocalView,
    Store,
    UsageKey,
    backoff_from,
    call,
)
from lanes._core.state.terms import Operator

log = logging.getLogger("lanes")
POISON_STRIKES = 3  # a shared store that answers but fails one batch this often: the batch is bad
Totals = tuple[
    list[tuple[UsageKey, int]],
    dict[tuple[str, int], float],
    list[tuple[str, Backoff]],
    dict[str, str],
    set[str],
    list[ApprovalRecord],
]


class SyncPeer(Protocol):
    """What the state sync asks of the dispatcher (it never reaches into its attributes)."""

    def take_audit_rows(self) -> list[dict[str, Any]]: ...
    def return_audit_rows(self, rows: list[dict[str, Any]]) -> int: ...
    def switches(self) -> frozenset[str]: ...
    def apply_switch(self, lane: str, off: bool) -> bool: ...
    def quarantine(self) -> dict[str, str]: ...
    def apply_quarantine(self, current: Mapping[str, str]) -> None: ...
    def probe_answered(self, scope: str, ok: bool) -> None: ...
    def take_approvals(self, records: list[ApprovalRecord]) -> None: ...


class Beats(Protocol):
    """This process's side of the shared terms and clock (`money/terms.py`): one beat a round."""

    async def round(self) -> None: ...
    async def leave(self) -> None: ...
    def operator(self) -> Operator | None: ...


class _Batch:
    """What one sync takes from the manager and the journal, to write or to give back."""

    def __init__(self, manager: FreeTierManager, peer: SyncPeer) -> None:
        self.usage, self.spend, self.backoffs, self.snapshots = manager.take_pending()
        self.audit = peer.take_audit_rows()

    def written(self, part: str) -> None:
        """`part` is in the store: neither given back (no double count) nor counted as dropped."""
        if part == "audit":
            self.audit = []
        elif part == "usage":
            self.usage, self.spend = [], {}
        elif part == "backoffs":
            self.backoffs = {}
        else:
            self.snapshots = {}

    def give_back(self, manager: FreeTierManager, peer: SyncPeer, now: float) -> int:
        """Queue what was not written again for the next try, bounded; returns the audit rows
        dropped to stay within the bound."""
        manager.give_back(self.usage, self.spend, self.backoffs, self.snapshots, now)
        return peer.return_audit_rows(self.audit)

    def count(self) -> str:
        return (
            f"{len(self.audit)} audit rows, {len(self.usage)} usage counts, "
            f"{len(self.backoffs)} backoffs, {len(self.snapshots)} header snapshots"
        )


class StateSync:
    def __init__(
        self,
        manager: FreeTierManager,
        store: Store,
        peer: SyncPeer,
        health: TaskHealth,
        listener: TaskHealth | None = None,
        beats: Beats | None = None,
    ) -> None:
        self.manager = manager
        self.store = store
        self.peer = peer
        self.beats = beats
        self.health = health
        self.listener = listener or health
        self._last_switches: set[str] = set()
        self._synced = False  # until the first successful sync (switches found then were kept)
        self._failing = False
        self._strikes = 0  # batches in a row a reachable shared store failed
        self._kick = trio.Event()

    def kick(self) -> None:
        """Sync now rather than at the next tick (something other hosts should hear about
        changed)."""
        self._kick.set()

    async def load(self, now: float) -> None:
        """Take the persisted state at startup: header snapshots, then a full sync."""
        with contextlib.suppress(*STORE_ERRORS):  # the sync below says so, once
            self.manager.merge_snapshots(await call(self.store, self.store.snapshots))
        await self.sync(now)

    def _view(self) -> LocalView:
        usage, spend, backoffs, snapshots = self.manager.view()
        return LocalView(
            usage=usage,
            spend=spend,
            backoffs=backoffs,
            snapshots=snapshots,
            switched_off=self.peer.switches(),
            operator=None if self.beats is None else self.beats.operator(),
        )

    async def sync(self, now: float) -> None:
        """One round: never raises (but for cancellation); failures go to the task's health."""
        try:
            await self._sync(now)
        except Exception as exc:  # the sync must not die: the next round tries again
            self.health.failed(exc, "sync failed")
        await trio.lowlevel.checkpoint()

    async def _sync(self, now: float) -> None:
        for lane, what in self.manager.take_clamped():
            log.warning("lane %s: %s out of bounds; clamped (said once)", lane, what)
        try:
            lost = await call(self.store, self.store.begin_sync, now)
        except STORE_ERRORS as exc:
            self._failed(exc)
            return
        batch = _Batch(self.manager, self.peer)
        view = self._view() if lost else None  # taken with the pending rows: it already holds them

        def work() -> Totals:
            if view is not None:
                self.store.reseed(view, now)
                batch.written("usage")  # the view held the pending counts
            self.store.records.add_audit(batch.audit)
            batch.written("audit")
            self.store.add_usage(batch.usage, batch.spend)
            batch.written("usage")
            self.store.put_backoffs(batch.backoffs, now)
            batch.written("backoffs")
            self.store.put_snapshots(batch.snapshots)
            batch.written("snapshots")
            self.store.flush()
            return (
                self.store.usage_totals(now),
                self.store.spend_totals(),
                self.store.backoffs(now),
                self.store.quarantined(),
                self.store.switches(),
                self.store.approvals(now),
            )

        try:
            totals = await call(self.store, work)
        except Exception as exc:  # an outage, or a batch the store refuses
            self._not_written(batch, exc, now)
            return
        self._strikes = 0
        self._written(totals, now, reseeded=view is not None)
        if self.beats is not None:
            try:
                await self.beats.round()
            except STORE_ERRORS as exc:
                self._failed(exc)

    def _not_written(self, batch: _Batch, exc: Exception, now: float) -> None:
        """Give the unwritten part of the batch back for the next try — unless the store refused
        it (any error but an outage, or the same shared store failing it thrice): then drop it."""
        outage = isinstance(exc, STORE_ERRORS)
        self._strikes = self._strikes + 1 if outage and self.store.shared else 0
        if outage and self._strikes < POISON_STRIKES:
            self.health.dropped("audit rows", batch.give_back(self.manager, self.peer, now))
            self._failed(exc)
            return
        self._strikes = 0
        self.health.dropped("poison batches")
        self.health.dropped("audit rows", len(batch.audit))
        self.health.failed(exc, f"the store refused a batch; dropped it ({batch.count()})")

    def _written(self, totals: Totals, now: float, *, reseeded: bool) -> None:
        """Take what the store holds."""
        usage, spends, others, quarantined, switches, approvals = totals
        if reseeded:
            log.warning(
                "state store: %s (%s); this host's view written back, paid fallback open",
                self.store.lost_reason or "empty at first contact",
                self.store.where,
            )
        elif self._failing:
            log.warning("state store: reachable again")
        self._failing = False
        self.health.ok()
        self.manager.merge_usage(usage, now)
        self.manager.merge_spend(spends)
        self.manager.merge_backoffs(others)
        self._take_quarantine(quarantined)
        self._take_switches(switches)
        self._synced = True
        self.peer.take_approvals(approvals)

    def _take_switches(self, switches: set[str]) -> None:
        for lane in switches - self._last_switches:
            self._switch(lane, True, first=not self._synced)
        for lane in self._last_switches - switches:
            self._switch(lane, False)
        self._last_switches = switches

    def catch_up(self, now: float) -> None:
        """Take the backoffs and kill switches other processes sharing this host's state file
        wrote since the last look — before a job's next attempt, not at the next sync. Cheap when
        nothing changed (SQLite: one `pread` of the change word; Redis publishes instead); never
        raises."""
        try:
            news = self.store.peek(now)
        except STORE_ERRORS:
            return  # the sync reports the store
        if news is None:
            return
        self.manager.merge_backoffs(news.backoffs)
        if self._synced:  # before the first sync, the switches found are the first sync's to say
            self._take_switches(news.switches)

    def _failed(self, exc: Exception) -> None:
        """One log line per failure streak."""
        if not self._failing:
            if self.store.shared:
                log.warning(
                    "state store: %s; serving on this host's view, paid fallback closed until the "
                    "shared ledger is back (retrying in the background)",
                    exc,
                )
            else:
                log.warning(
                    "state store: write failed (%s); counting in memory until it recovers", exc
                )
        self._failing = True
        self.health.failed(exc, "state store unavailable", logged=True)

    def _switch(self, lane: str, off: bool, *, first: bool = False) -> None:
        if not self.peer.apply_switch(lane, off):
            return
        if off and first:
            log.warning(
                "lane %s: switched off in the shared state (lanes lane on %s to undo)", lane, lane
            )
        else:
            log.warning(
                "lane %s: switched %s by another process sharing the state",
                lane,
                "off" if off else "on",
            )

    def _take_quarantine(self, current: dict[str, str]) -> None:
        known = self.peer.quarantine()
        for key in set(known) - set(current):
            log.warning("canary: %s released from quarantine", key)
        for key in set(current) - set(known):
            log.warning("canary: %s quarantined", key)
        self.peer.apply_quarantine(current)

    def apply(self, events: list[dict[str, Any]]) -> None:
        """Apply what other hosts published: backoffs, probe results, kill switches. A message that
        can not be read is dropped (and counted), never fatal."""
        for event in events:
            try:
                self._apply(event)
            except Exception:  # another host's message we can not read changes nothing
                self.listener.dropped("unreadable events")

    def _apply(self, event: dict[str, Any]) -> None:
        kind, subject = event["t"], event.get("scope", event.get("lane"))
        if kind == "grant":
            return  # the store applied it to its cache as it arrived
        if not isinstance(subject, str):
            raise TypeError("a message names no scope or lane")
        if kind == "backoff":
            self.manager.merge_backoffs([(subject, backoff_from(event))])
        elif kind == "probe":
            self.peer.probe_answered(subject, event["ok"] is True)
        elif kind == "switch":
            self._switch(subject, event["off"] is True)
        else:
            raise ValueError(f"an unknown message {kind!r}")

    async def run(self, wall_now: Callable[[], float], interval_s: float = 0.5) -> None:
        """Sync every `interval_s` (or when kicked) until cancelled; a last sync runs shielded on
        the way out (for at most a few seconds)."""
        try:
            while True:
                with trio.move_on_after(interval_s):
                    await self._kick.wait()
                self._kick = trio.Event()
                await self.sync(wall_now())
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(5.0):
                await self.sync(wall_now())
                if self.beats is not None:
                    with contextlib.suppress(*STORE_ERRORS):  # it lapses on its own otherwise
                        await self.beats.leave()

    async def listen(self) -> None:
        """For a shared store: apply other hosts' changes as they are published (retrying while it
        is down). Never dies: an outage is the sync's to report, anything else is this task's."""
        while True:
            try:
                events = await trio.to_thread.run_sync(
                    self.store.listen,
                    0.5,
                    limiter=self.store.listen_limiter,
                    abandon_on_cancel=True,
                )
            except STORE_ERRORS as exc:
                self.listener.failed(exc, "not hearing other hosts", logged=True)
                await trio.sleep(1.0)  # the sync logs the outage and notices the return
                continue
            except Exception as exc:
                self.listener.failed(exc, "listening failed")
                await trio.sleep(1.0)
                continue
            self.listener.ok()
            self.apply(events)

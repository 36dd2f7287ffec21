"""Keeps the dispatcher and the store in step: flush what changed, take what others wrote.

Every half second (sooner when a backoff, a kill switch or a probe result must reach the other
hosts) the pending counts, spend, backoffs, snapshots, audit rows and queued writes go to the store,
and the totals other processes wrote come back into the local view that every routing decision
reads. With SQLite the calls run inline (see `store.call`); with Redis they run in a worker thread,
and a second task applies what other hosts publish as it arrives. A store that fails is one log line
per failure streak: the rows wait for the next try, quotas and backoffs carry on from the local
view, and the paid ledger stays closed (see `Governors.reserve`) until a sync succeeds again.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import trio

from lanes._core.state.store import STORE_ERRORS, LocalView, Store, UsageKey, backoff_from, call
from lanes.freetier.backoff import Backoff
from lanes.freetier.manager import FreeTierManager

log = logging.getLogger("lanes")


class SyncPeer(Protocol):
    """What the state sync asks of the dispatcher (it never reaches into its attributes)."""

    def take_audit_rows(self) -> list[dict[str, Any]]: ...
    def return_audit_rows(self, rows: list[dict[str, Any]]) -> None: ...
    def switches(self) -> frozenset[str]: ...
    def apply_switch(self, lane: str, off: bool) -> bool: ...
    def quarantine(self) -> dict[str, str]: ...
    def apply_quarantine(self, current: Mapping[str, str]) -> None: ...
    def probe_answered(self, scope: str, ok: bool) -> None: ...


class StateSync:
    def __init__(self, manager: FreeTierManager, store: Store, peer: SyncPeer) -> None:
        self.manager = manager
        self.store = store
        self.peer = peer
        self._last_switches: set[str] = set()
        self._synced = (
            False  # until the first successful sync (switches found then were kept, not thrown now)
        )
        self._failing = False
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
        return LocalView(
            usage=list(self.manager.usage.counts.items()),
            spend=dict(self.manager.spend),
            backoffs=dict(self.manager.backoffs),
            snapshots=dict(self.manager.snapshots),
            switched_off=self.peer.switches(),
        )

    async def sync(self, now: float) -> None:
        try:
            lost = await call(self.store, self.store.begin_sync, now)
        except STORE_ERRORS as exc:
            self._failed(exc)
            return
        usage, spend, backoffs, snapshots = self.manager.take_pending()
        audit = self.peer.take_audit_rows()
        view = self._view() if lost else None  # taken with the pending rows: it already holds them
        reseeded = False

        def work() -> tuple[
            list[tuple[UsageKey, int]],
            dict[tuple[str, int], float],
            list[tuple[str, Backoff]],
            dict[str, str],
            set[str],
        ]:
            nonlocal reseeded
            if view is not None:
                self.store.reseed(view, now)
                reseeded = True
            self.store.add_audit(audit)
            if not reseeded:
                self.store.add_usage(usage, spend)
            self.store.put_backoffs(backoffs, now)
            self.store.put_snapshots(snapshots)
            self.store.flush()
            return (
                self.store.usage_totals(now),
                self.store.spend_totals(),
                self.store.backoffs(now),
                self.store.quarantined(),
                self.store.switches(),
            )

        try:
            totals, spends, others, quarantined, switches = await call(self.store, work)
        except STORE_ERRORS as exc:
            if not reseeded:  # keep them for the next try
                self.manager.pending_usage[:0] = usage
                for key, usd in spend.items():
                    self.manager.pending_spend[key] = self.manager.pending_spend.get(key, 0.0) + usd
            self.manager.changed_backoffs = {**backoffs, **self.manager.changed_backoffs}
            self.peer.return_audit_rows(audit)
            self._failed(exc)
            return
        if reseeded:
            log.warning(
                "state store: %s (%s); this host's view written back, paid fallback open",
                self.store.lost_reason or "empty at first contact",
                self.store.where,
            )
        elif self._failing:
            log.warning("state store: reachable again")
        self._failing = False
        self.manager.usage.merge(totals)
        self.manager.merge_spend(spends)
        self.manager.merge_backoffs(others)
        self.manager.usage.prune(now)
        self._take_quarantine(quarantined)
        for lane in switches - self._last_switches:
            self._switch(lane, True, first=not self._synced)
        for lane in self._last_switches - switches:
            self._switch(lane, False)
        self._last_switches = switches
        self._synced = True
        await trio.lowlevel.checkpoint()

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
        """Apply what other hosts published: backoffs, probe results, kill switches."""
        for event in events:
            try:
                kind = event["t"]
                if kind == "backoff":
                    self.manager.merge_backoffs([(event["scope"], backoff_from(event))])
                elif kind == "probe":
                    self.peer.probe_answered(event["scope"], bool(event["ok"]))
                elif kind == "switch":
                    self._switch(event["lane"], bool(event["off"]))
            except (KeyError, TypeError, ValueError):
                continue  # a message we can not read changes nothing

    async def run(self, wall_now: Callable[[], float], interval_s: float = 0.5) -> None:
        """Sync every `interval_s` (or when kicked) until cancelled; a last sync runs shielded on
        the way out."""
        try:
            while True:
                with trio.move_on_after(interval_s):
                    await self._kick.wait()
                self._kick = trio.Event()
                await self.sync(wall_now())
        finally:
            with trio.CancelScope(shield=True):
                await self.sync(wall_now())

    async def listen(self) -> None:
        """For a shared store: apply other hosts' changes as they are published (retrying while it
        is down)."""
        while True:
            try:
                events = await trio.to_thread.run_sync(
                    self.store.listen,
                    0.5,
                    limiter=self.store.listen_limiter,
                    abandon_on_cancel=True,
                )
            except STORE_ERRORS:
                await trio.sleep(1.0)  # the sync logs the outage and notices the return
                continue
            self.apply(events)

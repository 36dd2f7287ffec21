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


class AuditRows(Protocol):
    """The journal's rows waiting for the store."""

    def take_rows(self) -> list[dict[str, Any]]: ...
    def return_rows(self, rows: list[dict[str, Any]]) -> int: ...


class SwitchPeer(Protocol):
    """This process's switches (the engine's `Switchboard`): what the store's must reach."""

    def switched_off(self) -> frozenset[str]: ...
    def switch(self, lane: str, off: bool) -> bool: ...
    def quarantined(self) -> dict[str, str]: ...
    def quarantine(self, current: Mapping[str, str]) -> None: ...


class ProbeNews(Protocol):
    def remote_answered(self, scope: str) -> None: ...


class ApprovalNews(Protocol):
    def take(self, records: list[ApprovalRecord]) -> None: ...


class Kick:
    """A request that the state sync run now rather than at its next tick: rung by whoever holds
    news the other processes wait for (a probe's answer, a backoff, a switch)."""

    def __init__(self) -> None:
        self._event = trio.Event()

    def ring(self) -> None:
        self._event.set()

    async def wait(self, timeout_s: float) -> None:
        """Until rung, or `timeout_s`; then ready to be rung again."""
        with trio.move_on_after(timeout_s):
            await self._event.wait()
        self._event = trio.Event()


class Beats(Protocol):
    """This process's side of the shared terms and clock (`money/terms.py`): one beat a round."""

    async def round(self) -> None: ...
    async def leave(self) -> None: ...
    def operator(self) -> Operator | None: ...


class _Batch:
    """What one sync takes from the manager and the journal, to write or to give back."""

    def __init__(self, manager: FreeTierManager, rows: AuditRows) -> None:
        self.usage, self.spend, self.backoffs, self.snapshots = manager.take_pending()
        self.audit = rows.take_rows()

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

    def give_back(self, manager: FreeTierManager, rows: AuditRows, now: float) -> int:
        """Queue what was not written again for the next try, bounded; returns the audit rows
        dropped to stay within the bound."""
        manager.give_back(self.usage, self.spend, self.backoffs, self.snapshots, now)
        return rows.return_rows(self.audit)

    def count(self) -> str:
        return (
            f"{len(self.audit)} audit rows, {len(self.usage)} usage counts, "
            f"{len(self.backoffs)} backoffs, {len(self.snapshots)} header snapshots"
        )


class StateSync:
    def __init__(
        self,
        *,
        manager: FreeTierManager,
        store: Store,
        now_wall: Callable[[], float],
        rows: AuditRows,
        switches: SwitchPeer,
        news: tuple[ProbeNews, ApprovalNews],
        health: tuple[TaskHealth, TaskHealth],
        kick: Kick,
        beats: Beats | None = None,
    ) -> None:
        """`news`: the probes and approvals that hear what other processes decided; `health`:
        the sync's task and the listener's."""
        self._manager = manager
        self._store = store
        self._now = now_wall
        self._rows = rows
        self._switches = switches
        self._probes, self._approvals = news
        self._health, self._listener = health
        self._kick = kick
        self._beats = beats
        self._last_switches: set[str] = set()
        self._synced = False  # until the first successful sync (switches found then were kept)
        self._failing = False
        self._strikes = 0  # batches in a row a reachable shared store failed

    def kick(self) -> None:
        """Sync now rather than at the next tick (something other hosts should hear about
        changed)."""
        self._kick.ring()

    def backoffs_changed(self) -> None:
        """A rate limit changed a backoff: the other processes must see it before their next
        attempt. A store on this host (SQLite) takes it now, inline; a shared one (Redis) with the
        sync, run now."""
        changed = self._manager.changed_backoffs()
        if not changed:
            return
        if self._store.limiter is None:
            # on failure the sync writes it (and reports the store) at its next round
            with contextlib.suppress(*STORE_ERRORS):
                self._store.put_backoffs(dict(changed), self._now())
        elif self._store.shared:
            self.kick()

    async def load(self, now: float) -> None:
        """Take the persisted state at startup: header snapshots, then a full sync."""
        with contextlib.suppress(*STORE_ERRORS):  # the sync below says so, once
            self._manager.merge_snapshots(await call(self._store, self._store.snapshots))
        await self.sync(now)

    def _view(self) -> LocalView:
        usage, spend, backoffs, snapshots = self._manager.view()
        return LocalView(
            usage=usage,
            spend=spend,
            backoffs=backoffs,
            snapshots=snapshots,
            switched_off=self._switches.switched_off(),
            operator=None if self._beats is None else self._beats.operator(),
        )

    async def sync(self, now: float) -> None:
        """One round: never raises (but for cancellation); failures go to the task's health."""
        try:
            await self._sync(now)
        except Exception as exc:  # the sync must not die: the next round tries again
            self._health.failed(exc, "sync failed")
        await trio.lowlevel.checkpoint()

    async def _sync(self, now: float) -> None:
        for lane, what in self._manager.take_clamped():
            log.warning("lane %s: %s out of bounds; clamped (said once)", lane, what)
        try:
            lost = await call(self._store, self._store.begin_sync, now)
        except STORE_ERRORS as exc:
            self._failed(exc)
            return
        batch = _Batch(self._manager, self._rows)
        view = self._view() if lost else None  # taken with the pending rows: it already holds them

        def work() -> Totals:
            if view is not None:
                self._store.reseed(view, now)
                batch.written("usage")  # the view held the pending counts
            self._store.records.add_audit(batch.audit)
            batch.written("audit")
            self._store.add_usage(batch.usage, batch.spend)
            batch.written("usage")
            self._store.put_backoffs(batch.backoffs, now)
            batch.written("backoffs")
            self._store.put_snapshots(batch.snapshots)
            batch.written("snapshots")
            self._store.flush()
            return (
                self._store.usage_totals(now),
                self._store.spend_totals(),
                self._store.backoffs(now),
                self._store.quarantined(),
                self._store.switches(),
                self._store.approvals(now),
            )

        try:
            totals = await call(self._store, work)
        except Exception as exc:  # an outage, or a batch the store refuses
            self._not_written(batch, exc, now)
            return
        self._strikes = 0
        self._written(totals, now, reseeded=view is not None)
        if self._beats is not None:
            try:
                await self._beats.round()
            except STORE_ERRORS as exc:
                self._failed(exc)

    def _not_written(self, batch: _Batch, exc: Exception, now: float) -> None:
        """Give the unwritten part of the batch back for the next try — unless the store refused
        it (any error but an outage, or the same shared store failing it thrice): then drop it."""
        outage = isinstance(exc, STORE_ERRORS)
        self._strikes = self._strikes + 1 if outage and self._store.shared else 0
        if outage and self._strikes < POISON_STRIKES:
            self._health.dropped("audit rows", batch.give_back(self._manager, self._rows, now))
            self._failed(exc)
            return
        self._strikes = 0
        self._health.dropped("poison batches")
        self._health.dropped("audit rows", len(batch.audit))
        self._health.failed(exc, f"the store refused a batch; dropped it ({batch.count()})")

    def _written(self, totals: Totals, now: float, *, reseeded: bool) -> None:
        """Take what the store holds."""
        usage, spends, others, quarantined, switches, approvals = totals
        if reseeded:
            log.warning(
                "state store: %s (%s); this host's view written back",
                self._store.lost_reason or "empty at first contact",
                self._store.where,
            )
        elif self._failing:
            log.warning("state store: reachable again")
        self._failing = False
        self._health.ok()
        self._manager.merge_usage(usage, now)
        self._manager.merge_spend(spends)
        self._manager.merge_backoffs(others)
        self._take_quarantine(quarantined)
        self._take_switches(switches)
        self._synced = True
        self._approvals.take(approvals)

    def _take_switches(self, switches: set[str]) -> None:
        for lane in switches - self._last_switches:
            self._switch(lane, True, first=not self._synced)
        for lane in self._last_switches - switches:
            self._switch(lane, False)
        self._last_switches = switches

    def catch_up(self) -> None:
        """Take the backoffs and kill switches other processes sharing this host's state file
        wrote since the last look — before a job's next attempt, not at the next sync. Cheap when
        nothing changed (SQLite: one `pread` of the change word; Redis publishes instead); never
        raises."""
        try:
            news = self._store.peek(self._now())
        except STORE_ERRORS:
            return  # the sync reports the store
        if news is None:
            return
        self._manager.merge_backoffs(news.backoffs)
        if self._synced:  # before the first sync, the switches found are the first sync's to say
            self._take_switches(news.switches)

    def _failed(self, exc: Exception) -> None:
        """One log line per failure streak."""
        if not self._failing:
            if self._store.shared:
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
        self._health.failed(exc, "state store unavailable", logged=True)

    def _switch(self, lane: str, off: bool, *, first: bool = False) -> None:
        if not self._switches.switch(lane, off):
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
        known = self._switches.quarantined()
        for key in set(known) - set(current):
            log.warning("canary: %s released from quarantine", key)
        for key in set(current) - set(known):
            log.warning("canary: %s quarantined", key)
        self._switches.quarantine(current)

    def apply(self, events: list[dict[str, Any]]) -> None:
        """Apply what other hosts published: backoffs, probe results, kill switches. A message that
        can not be read is dropped (and counted), never fatal."""
        for event in events:
            try:
                self._apply(event)
            except Exception:  # another host's message we can not read changes nothing
                self._listener.dropped("unreadable events")

    def _apply(self, event: dict[str, Any]) -> None:
        kind, subject = event["t"], event.get("scope", event.get("lane"))
        if kind == "grant":
            return  # the store applied it to its cache as it arrived
        if not isinstance(subject, str):
            raise TypeError("a message names no scope or lane")
        if kind == "backoff":
            self._manager.merge_backoffs([(subject, backoff_from(event))])
        elif kind == "probe":
            if event["ok"] is True:
                self._manager.confirm(subject)
            self._probes.remote_answered(subject)
        elif kind == "switch":
            self._switch(subject, event["off"] is True)
        else:
            raise ValueError(f"an unknown message {kind!r}")

    async def run(self, interval_s: float = 0.5) -> None:
        """Sync every `interval_s` (or when kicked) until cancelled; a last sync runs shielded on
        the way out (for at most a few seconds)."""
        try:
            while True:
                await self._kick.wait(interval_s)
                await self.sync(self._now())
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(5.0):
                await self.sync(self._now())
                if self._beats is not None:
                    with contextlib.suppress(*STORE_ERRORS):  # it lapses on its own otherwise
                        await self._beats.leave()

    async def listen(self) -> None:
        """For a shared store: apply other hosts' changes as they are published (retrying while it
        is down). Never dies: an outage is the sync's to report, anything else is this task's."""
        while True:
            try:
                events = await trio.to_thread.run_sync(
                    self._store.listen,
                    0.5,
                    limiter=self._store.listen_limiter,
                    abandon_on_cancel=True,
                )
            except STORE_ERRORS as exc:
                self._listener.failed(exc, "not hearing other hosts", logged=True)
                await trio.sleep(1.0)  # the sync logs the outage and notices the return
                continue
            except Exception as exc:
                self._listener.failed(exc, "listening failed")
                await trio.sleep(1.0)
                continue
            self._listener.ok()
            self.apply(events)

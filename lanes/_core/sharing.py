"""Keeps the FreeTierManager and the store in step: flush what changed, take what others wrote.

Store calls run inline on the trio thread: they are small local SQLite transactions (WAL,
synchronous=NORMAL, no fsync per commit, a short busy timeout), cheaper than a thread hop, and a
worker thread would let trio's autojump clock leap while it ran. A store that fails (or stays
locked by another process) is one log line per failure streak; its pending rows wait for the next try.
"""

from __future__ import annotations

import logging
import sqlite3

import trio

from lanes._core.store import Store
from lanes.freetier.manager import FreeTierManager

log = logging.getLogger("lanes")


class Sharing:
    def __init__(self, manager: FreeTierManager, store: Store, *, audit: list | None = None,
                 quarantine: dict[str, str] | None = None) -> None:
        self.manager = manager
        self.store = store
        self.audit = audit if audit is not None else []  # rows appended by the dispatcher, flushed here
        self.quarantine = quarantine if quarantine is not None else {}  # the canary's verdicts, read here
        self._failing = False

    async def load(self, now: float) -> None:
        """Take the persisted state at startup: counters, spend, snapshots, live backoffs."""
        def read():
            return (self.store.usage_totals(now), self.store.spend_totals(), self.store.backoffs(now),
                    self.store.snapshots())
        usage, spend, backoffs, snapshots = read()
        self._take_quarantine(self.store.quarantined())
        await trio.lowlevel.checkpoint()
        self.manager.usage.merge(usage)
        self.manager.merge_spend(spend)
        self.manager.merge_backoffs(backoffs)
        self.manager.merge_snapshots(snapshots)

    async def sync(self, now: float) -> None:
        usage, spend, backoffs, snapshots = self.manager.take_pending()
        audit, self.audit[:] = list(self.audit), []

        def work():
            self.store.add_audit(audit)
            self.store.add_usage(usage, spend)
            self.store.put_backoffs(backoffs)
            self.store.put_snapshots(snapshots)
            return (self.store.usage_totals(now), self.store.spend_totals(), self.store.backoffs(now),
                    self.store.quarantined())

        try:
            totals, spends, others, quarantined = work()
        except sqlite3.Error as exc:
            self.manager.pending_usage[:0] = usage  # keep them for the next try
            for key, usd in spend.items():
                self.manager.pending_spend[key] = self.manager.pending_spend.get(key, 0.0) + usd
            self.manager.changed_backoffs = {**backoffs, **self.manager.changed_backoffs}
            self.audit[:0] = audit
            if not self._failing:
                log.warning("state store: write failed (%s); counting in memory until it recovers", exc)
            self._failing = True
            return
        if self._failing:
            log.warning("state store: writable again")
        self._failing = False
        self.manager.usage.merge(totals)
        self.manager.merge_spend(spends)
        self.manager.merge_backoffs(others)
        self.manager.usage.prune(now)
        self._take_quarantine(quarantined)
        await trio.lowlevel.checkpoint()

    def _take_quarantine(self, current: dict[str, str]) -> None:
        for key in set(self.quarantine) - set(current):
            log.warning("canary: %s released from quarantine", key)
        for key in set(current) - set(self.quarantine):
            log.warning("canary: %s quarantined", key)
        self.quarantine.clear()
        self.quarantine.update(current)

    async def run(self, wall_now, interval_s: float = 0.5) -> None:
        """Sync every `interval_s` until cancelled; a last sync runs shielded on the way out."""
        try:
            while True:
                await trio.sleep(interval_s)
                await self.sync(wall_now())
        finally:
            with trio.CancelScope(shield=True):
                await self.sync(wall_now())

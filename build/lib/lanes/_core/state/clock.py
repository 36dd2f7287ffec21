"""Time a process can trust: its wall source, checked against the state store's clock.

The store's clock is the one every process sharing it reads the same:

- **Redis**: the server's `TIME`. It is measured at every sync (the beat), and read again inside the
  reservation script, which decides the ledger's day by it and refuses a process whose wall is
  off by more than the tolerance — atomically, whatever the last beat said.
- **A SQLite file**: the host's own clock (`Wall.reference`), which every process on the host
  shares; it is read afresh at every check.
- **`:memory:`**: no one else shares the day: the process's own wall.

A process whose wall disagrees with the store's clock by more than `policy.clock_tolerance_s`
closes paid (no paid attempt; free capacity carries on) and says why — one log line per episode,
`/v1/lanes`, and the skip reason in each job's story. So does a process whose view of the store's
clock disagrees with a live peer's (their beats): on one host, a process whose whole clock is
moved (libfaketime, a container's time namespace) reads a moved host clock too, and only the other
processes' views can tell — neither knows which is right, so both close paid until they agree.
Money and expiry decisions (the ledger's day, grants, approvals, "approve once"s) read
`trusted()`, the store's clock as best known here.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import attrs
import trio

from lanes._core.model.clocks import EpochTime, disagreement
from lanes._core.runtime.wall import Wall
from lanes._core.state.terms import LIVE_S, Host

log = logging.getLogger("lanes")


@attrs.frozen(kw_only=True)
class ClockStatistics:
    wall: float  # this process's wall source (epoch seconds)
    trusted: float  # the store's clock, as best known here
    skew_s: float | None  # the store's clock minus this wall, last measured (None: not yet)
    tolerance_s: float
    source: str  # whose clock the wall is checked against
    refusal: str  # why paid is closed by the clock ("" when it is not)
    offset_s: float  # the drill hook's offset (and any test step), 0.0 normally


class StoreClock:
    """The clock the state store decides by — its day, every expiry — as seen from this process:
    the wall source checked against the store's own (Redis: the server's `TIME`; a shared file:
    the host's), and paid closed while the two disagree by more than `tolerance_s`."""

    @classmethod
    def of(cls, wall: Wall, store: Any, tolerance_s: float) -> StoreClock:
        """The clock of `store` (anything with the store's `kind` and `where`)."""
        return cls(wall, tolerance_s=tolerance_s, kind=store.kind, where=store.where)

    def __init__(self, wall: Wall, *, tolerance_s: float, kind: str, where: str) -> None:
        self.wall = wall
        self.tolerance_s = tolerance_s
        self._alone = kind != "redis" and where == ":memory:"
        self._shared = kind == "redis"
        self.source = (
            "the Redis server's clock (TIME)"
            if self._shared
            else "this process's own clock (state in memory)"
            if self._alone
            else "the host's clock"
        )
        self.skew_s: float | None = None if self._shared else 0.0
        self._refusal = ""
        self._peers = ""  # why a peer's view of the clock closes paid ("" when none does)
        self._seen: dict[str, _Peer] = {}  # each peer, as last read
        self._looked_at: float | None = None  # trio clock: that last read
        self._peer: tuple[str, bool] | None = None  # what `_peers` says, to say it once

    def trusted(self) -> EpochTime:
        """Epoch seconds on the store's clock, as best known in this process."""
        if self._alone:
            return self.wall()
        if not self._shared:
            return self.wall.reference()
        return EpochTime(self.wall() + (self.skew_s or 0.0))

    def refusal(self) -> str:
        """Why paid is closed by the clock ("" when it is not). For a SQLite file, measured now."""
        self.measure()
        return self._refusal or self._peers

    def measure(self) -> float | None:
        """The store's clock minus this wall: for a SQLite file (the host's clock) measured now,
        for Redis as the last beat measured it (None: not yet)."""
        if not self._alone and not self._shared:
            self.observe(self.wall.reference() - self.wall())
        return self.skew_s

    def compare(self, peers: Sequence[Host], wall: float) -> None:
        """The other processes' beats as this one's last beat read them, against its own view of
        the store's clock then (`wall`, its wall at that beat, plus its skew). A peer whose beat
        moved since the last look is live (for `LIVE_S` after), and its view was taken since
        that look: when the two views differ by more than the tolerance (plus that time), paid
        closes — one of the two has the day wrong, and a day counted twice is the ceiling spent
        twice. A peer that far off and not yet seen moving closes paid too, until it moves or
        has stood still for `LIVE_S` (a stale entry of a process gone, then passed over)."""
        now = trio.current_time()
        since = 0.0 if self._looked_at is None else now - self._looked_at
        mine = wall + (self.skew_s or 0.0)
        # a peer not read this time (its entry dropped as gone by a clock that may be the wrong
        # one) is kept while it may be live
        seen = {h: p for h, p in self._seen.items() if now - p.since <= LIVE_S}
        for peer in peers:
            if peer.skew_s is None:  # it has not measured a store's own clock (Redis) yet
                continue
            host = peer.announced.host
            off = mine - (peer.wall + peer.skew_s)
            old = self._seen.get(host)
            if old is None:
                seen[host] = _Peer(peer.announced.label, peer.wall, off, now, moved=False)
            elif peer.wall != old.wall:  # it beat since the last look: its view is fresh
                far = abs(off) > self.tolerance_s + since
                seen[host] = _Peer(old.label, peer.wall, off if far else 0.0, now, moved=True)
            else:
                seen[host] = old
        self._seen, self._looked_at = seen, now
        found = next(
            (p for p in seen.values() if abs(p.off) > self.tolerance_s and now - p.since <= LIVE_S),
            None,
        )
        said = "" if found is None else found.refusal(self.tolerance_s)
        key = None if found is None else (found.label, found.moved)
        if found is not None and key != self._peer:
            log.warning("clock: %s", said)
        elif self._peers and not said:
            log.warning("clock: the processes sharing the state store agree on the clock again")
        self._peers, self._peer = said, key

    def observe(self, skew_s: float) -> None:
        """The store's clock was `skew_s` ahead of this wall (negative: behind) just now."""
        self.skew_s = skew_s
        said = "" if self._alone else disagreement(skew_s, self.tolerance_s, self.source)
        if said and not self._refusal:
            log.warning("clock: %s", said)
        elif self._refusal and not said:
            log.warning(
                "clock: this process's wall clock agrees with %s again (%+.1fs); paid open",
                self.source,
                skew_s,
            )
        self._refusal = said

    def statistics(self) -> ClockStatistics:
        return ClockStatistics(
            wall=self.wall(),
            trusted=self.trusted(),
            skew_s=self.skew_s,
            tolerance_s=self.tolerance_s,
            source=self.source,
            refusal=self.refusal(),
            offset_s=self.wall.offset_s,
        )


@attrs.frozen
class _Peer:
    """Another process as this one last read its beat."""

    label: str
    wall: float  # its wall at that beat
    off: float  # our view of the store's clock minus its view, when it was fresh (0: agreed)
    since: float  # trio clock: when we first read it, or last saw it move
    moved: bool  # seen moving: live, not just an entry

    def refusal(self, tolerance_s: float) -> str:
        if not self.moved:
            return (
                f"{self.label}, sharing the state store, reads the clock {-self.off:+.1f}s from "
                "this process; paid stays closed until it beats again (a live process) or stands "
                f"still for {LIVE_S:g}s (a process gone)"
            )
        return (
            f"this process reads the clock {self.off:+.1f}s from {self.label}, a live process "
            f"sharing the state store (more than the {tolerance_s:g}s tolerance): one of the two "
            "has the day wrong, so paid stays closed on both until they agree"
        )

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
`/v1/lanes`, and the skip reason in each job's story. Money and expiry decisions (the ledger's
day, grants, approvals, "approve once"s) read `trusted()`, the store's clock as best known here.
"""

from __future__ import annotations

import logging
from typing import Any

import attrs

from lanes._core.model.clocks import EpochTime, disagreement
from lanes._core.runtime.wall import Wall

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

    def trusted(self) -> EpochTime:
        """Epoch seconds on the store's clock, as best known in this process."""
        if self._alone:
            return self.wall()
        if not self._shared:
            return self.wall.reference()
        return EpochTime(self.wall() + (self.skew_s or 0.0))

    def refusal(self) -> str:
        """Why paid is closed by the clock ("" when it is not). For a SQLite file, measured now."""
        if not self._alone and not self._shared:
            self.observe(self.wall.reference() - self.wall())
        return self._refusal

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

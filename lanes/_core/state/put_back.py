"""After Redis lost the day's paid ledger: paid stays closed until every host that was live put
its own reservations back.

A loss is noticed three ways: the epoch key is gone (a restart without persistence, a flush), it
changed (another host noticed first), or the reservation script found the day's total missing
while the day had reservations (`RESERVE` rotates the epoch then, so every host notices at its
next sync). Each host puts back what it reserved today and yesterday from its own records
(`RESTORE`, upward only: a reservation already counted is not counted twice) and says so under
the new epoch (`restored:<epoch>`). A host's paid reopens when every host it saw live at its last
beat before the loss has said so, or has been silent for `LIVE_S` (a host gone: its records come
back with it, at its next start). Never from one host's partial view; never reseeded downward.
"""

from __future__ import annotations

import attrs

from lanes._core.state.terms import LIVE_S


@attrs.define
class PutBack:
    """Whom this host waits for before its paid reopens after a loss (monotonic seconds)."""

    own: str  # this host: awaited too, until its own reservations are back
    reason: str = ""  # what was lost ("": nothing is being put back)
    since: float = 0.0  # when the loss was noticed
    awaited: frozenset[str] = frozenset()  # hosts live before the loss, not yet put back
    said: bool = False  # the closing was logged (so its reopening is too)

    @property
    def waiting(self) -> bool:
        return bool(self.reason)

    def lost(self, reason: str, peers: frozenset[str], now: float) -> None:
        """A loss noticed at `now`; `peers` are the other hosts live at the last beat. This host
        waits for itself too (its own put-back, `heard`). A second notice while waiting keeps the
        first's time and adds its peers."""
        if not self.reason:
            self.since = now
        self.reason = reason
        self.awaited |= peers | {self.own}

    def to_say(self, where: str) -> str:
        """Why paid is closed, the first time it is asked while waiting ("" after, or when
        open): one log line per loss."""
        if not self.reason or self.said:
            return ""
        self.said = True
        return self.why_closed(where)

    def heard(self, restored: set[str], now: float) -> tuple[list[str], bool]:
        """Take the hosts that said they put theirs back; the others given up on (silent for
        `LIVE_S`; never this host) are returned, and whether paid reopened after its closing
        was said. Paid reopens when none is left."""
        self.awaited -= restored
        gone = sorted(self.awaited - {self.own}) if now - self.since >= LIVE_S else []
        self.awaited -= set(gone)
        reopened = False
        if self.reason and not self.awaited:
            reopened, self.reason, self.said = self.said, "", False
        return gone, reopened

    def why_closed(self, where: str) -> str:
        """Why paid is closed ("" when it is not)."""
        if not self.reason:
            return ""
        hosts = ", ".join(
            ["this host"] * (self.own in self.awaited) + sorted(self.awaited - {self.own})
        )
        return (
            f"redis at {where}: {self.reason}; paid fallback stays closed until every host that "
            f"was live has put its reservations back (waiting for: {hosts})"
        )

"""After Redis lost the day's paid ledger: paid stays closed until every host that was live put
its own reservations back.

A loss is noticed three ways: the epoch key is gone (a restart without persistence, a flush), it
changed (another host noticed first), or the reservation script found the day's total missing
while the day had reservations (`RESERVE` rotates the epoch then, so every host notices at its
next sync). Each host puts back what it reserved today and yesterday from its own records
(`RESTORE`, upward only: a reservation already counted is not counted twice) and says so under
the new epoch (`restored:<epoch>`). A host's paid reopens when every host it saw live at its last
beat before the loss (or that Redis lists) has said so; a host that stays silent holds it closed
until it starts again (its records come back with it) or the UTC day ends — until then its
reservations may still be billed. A host that meets an empty Redis holding reservations of its
own for the day (every host restarted while Redis lost its data: the others' ids are new, and
unknown) waits `LIVE_S` for them to come back and put theirs back. Never from one host's partial
view; never reseeded downward.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import attrs

from lanes._core.state.backend import RedisBase, text
from lanes._core.state.redis_scripts import ROTATE
from lanes._core.state.terms import LIVE_S

log = logging.getLogger("lanes")
DAY_S = 86400.0  # a UTC day: the ledger's


@attrs.define
class PutBack:
    """Whom this host waits for before its paid reopens after a loss (monotonic seconds)."""

    own: str  # this host: awaited too, until its own reservations are back
    reason: str = ""  # what was lost ("": nothing is being put back)
    since: float = 0.0  # when the loss was noticed
    awaited: frozenset[str] = frozenset()  # hosts live before the loss, not yet put back
    said: bool = False  # the closing was logged (so its reopening is too)
    until: float = 0.0  # not reopened before this, whoever has put back (hosts not known)
    patience_s: float = LIVE_S  # how long a silent host is waited for, from the loss

    @property
    def waiting(self) -> bool:
        return bool(self.reason)

    def lost(
        self,
        reason: str,
        peers: frozenset[str],
        now: float,
        hold_s: float = 0.0,
        patience_s: float = LIVE_S,
    ) -> None:
        """A loss noticed at `now`; `peers` are the other hosts live at the last beat. This host
        waits for itself too (its own put-back, `heard`), and — `hold_s` — for hosts it can not
        name (restarted with Redis, under new ids) to come back and put theirs back. A host that
        stays silent is given up on after `patience_s` (on Redis: when the day ends — until then
        its reservations may come back). A second notice while waiting keeps the first's time and
        patience and adds its peers."""
        if not self.reason:
            self.since, self.patience_s = now, patience_s
        self.reason = reason
        self.until = max(self.until, now + hold_s)
        self.awaited |= peers | {self.own}  # heard again under the epoch now, if already

    def to_say(self, where: str) -> str:
        """Why paid is closed, the first time it is asked while waiting ("" after, or when
        open): one log line per loss."""
        if not self.reason or self.said:
            return ""
        self.said = True
        return self.why_closed(where)

    def heard(self, restored: set[str], now: float) -> tuple[list[str], bool]:
        """Take the hosts that said they put theirs back; the others given up on (silent for
        `patience_s`; never this host) are returned, and whether paid reopened after its closing
        was said. Paid reopens when none is left."""
        self.awaited -= restored
        gone = sorted(self.awaited - {self.own}) if now - self.since >= self.patience_s else []
        self.awaited -= set(gone)
        reopened = False
        if self.reason and not self.awaited and now >= self.until:
            reopened, self.reason, self.said = self.said, "", False
        return gone, reopened

    def why_closed(self, where: str) -> str:
        """Why paid is closed ("" when it is not)."""
        if not self.reason:
            return ""
        hosts = ", ".join(
            ["this host"] * (self.own in self.awaited)
            + sorted(self.awaited - {self.own})
            + [f"any host it can not name, {self.until - self.since:.0f} s"]
            * (self.until > self.since)
        )
        return (
            f"redis at {where}: {self.reason}; paid fallback stays closed until every host that "
            f"was live has put its reservations back (waiting for: {hosts}; a host that is gone "
            "holds it closed until it starts again, or the UTC day ends)"
        )


class RedisPutBack(RedisBase):
    """The put-back on Redis: a loss noticed, this host's own reservations put back and said
    under the epoch (`restored:<epoch>`), the others heard — and paid's one line each way."""

    _epoch: str | None  # the server's epoch as this host knows it (a new one: a loss)
    _reseed_due: bool  # Redis forgot our state and we have not pushed our view back yet
    _put_back: PutBack  # after a loss: the hosts paid waits for
    _peers: frozenset[str]  # the other hosts live at this host's last beat

    def _reseed_paid(self, pipe: Any) -> None:
        """This host's own reservations back, queued on `pipe` (the ledger's: `RedisPaid`)."""
        raise NotImplementedError

    def _lost_day(
        self,
        reason: str,
        now: float,
        server_time: float,
        live: frozenset[str] = frozenset(),
        hold_s: float = 0.0,
    ) -> None:
        """Redis lost the day's ledger (`now`: monotonic): this host puts its own reservations
        back and paid closes until every host live before (at its last beat, or in the hosts
        Redis still lists: `live`) has too (`put_back.py`)."""
        with self._lock:
            # a silent host's reservations may come back until the day ends: waited for till then
            left_s = DAY_S - server_time % DAY_S
            self._put_back.lost(reason, self._peers | live, now, hold_s, patience_s=left_s)
            self._reseed_due = True

    def _put_own_back(self, epoch: str) -> None:
        """After a loss, under the server's epoch: this host's reservations back (upward) and
        said under the epoch — when it is waited for, or other hosts have begun (a host that
        joined after the loss answers too) — and the hosts that have said so heard."""
        restored = self._k("restored", epoch)
        members = {text(m) for m in self._redis.smembers(restored)}
        with self._lock:
            owed = self._host not in members and (
                self._host in self._put_back.awaited or bool(members)
            )
            pipe = self._redis.pipeline(transaction=False)
            if owed:
                self._reseed_paid(pipe)
        if owed:
            pipe.sadd(restored, self._host)
            pipe.expire(restored, 2 * 86400)
            pipe.execute()
            members.add(self._host)
        self._heard(members)

    def _rotate(self, read: str) -> str:
        """Move the epoch on from `read` (unless another host did): every host puts back."""
        return text(self._script(ROTATE)(keys=[self._k("epoch")], args=[read, uuid.uuid4().hex]))

    def _say_closed(self) -> str:
        """Why paid waits for the put-back, logged once per loss (and returned)."""
        with self._lock:
            why, first = self._put_back.why_closed(self.where), self._put_back.to_say(self.where)
        if first:
            log.warning("state store: %s", first)
        return why

    def _heard(self, restored: set[str]) -> None:
        """Hosts that put their reservations back under the current epoch (this one included)."""
        with self._lock:
            if not self._put_back.waiting:
                return
            now = time.monotonic()  # wall-clock: hosts put back in real time
            gone, opened = self._put_back.heard(restored, now)
        if gone:
            log.warning(
                "state store: redis at %s: hosts %s stayed silent until the day of the loss "
                "ended; paid no longer waits for them",
                self.where,
                ", ".join(gone),
            )
        if opened:
            log.warning(
                "state store: redis at %s: every live host put its reservations back; paid "
                "fallback may open",
                self.where,
            )

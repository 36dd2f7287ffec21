"""The paid ledger: what paid attempts reserved and what they really cost, per UTC day.

The rules, on both backends, each one atomic step across every process and host sharing the store:

- a reservation is granted only when the day's reserved-or-settled total plus its amount stays
  within the ceiling — the lower of the caller's and the store's terms' (see `beats.py`) — and,
  for a client with a ceiling of its own, the client's total within that too; an unsettled
  reservation counts in full, so a crash never under-counts;
- settling replaces a reservation by what the attempt cost (never more than it reserved);
- a store that lost its data gets this process's own reservations back (`reseed`), so the ceiling
  holds across the loss.

SQLite: rows of `paid_ledger` and their running totals per day and client (`paid_totals`, kept by
triggers), checked and written in one `BEGIN IMMEDIATE` transaction. Redis: a hash per day and its
running total in integer pico-dollars (a client's too), checked and written by one Lua script
(`RESERVE`) that also decides the day by the server's clock (TIME).

Rows are never deleted: the file keeps every day's reservations (and a totals row per day and
client), for the reports.
"""

from __future__ import annotations

import logging
import math
import sqlite3
import time
import uuid
from itertools import groupby
from operator import itemgetter
from typing import Any, Protocol

import attrs

from lanes._core.freetier.windows import window_id
from lanes._core.policy.ceiling import ceiling_in_force, fits, room
from lanes._core.state.backend import (
    ClockRefused,
    SQLiteBase,
    StoreUnavailable,
    guarded,
    text,
)
from lanes._core.state.beats import shared_ceiling
from lanes._core.state.put_back import RedisPutBack
from lanes._core.state.records import LocalRecords
from lanes._core.state.redis_scripts import PICO, RESERVE, RESTORE, SETTLE, pico
from lanes._core.state.sqlite_file import immediate

log = logging.getLogger("lanes")

SCHEMA = """
CREATE TABLE IF NOT EXISTS paid_ledger (
    id TEXT PRIMARY KEY, day INTEGER, reserved FLOAT, settled FLOAT, lane TEXT, model TEXT,
    job TEXT, cohort TEXT, client TEXT);
CREATE INDEX IF NOT EXISTS idx_paid_ledger_day ON paid_ledger (day);
"""

#: What `paid_ledger`'s rows of a day and client add up to (`named` 0: the rows without a client),
#: so a reservation reads one row, not the day's. A compensated sum (Neumaier's): `spent + carry`
#: is the rows' sum to within a few ulps however many settlements moved it, where a plain running
#: sum would gain one rounding error per write. Created by `migrate`, never by `SCHEMA`.
TOTALS = """
CREATE TABLE paid_totals (
    day INTEGER NOT NULL, named INTEGER NOT NULL, client TEXT NOT NULL,
    spent FLOAT NOT NULL, carry FLOAT NOT NULL, PRIMARY KEY (day, named, client)) WITHOUT ROWID
"""


def _key(row: str = "") -> str:
    """The key of ledger row `row`'s totals row (NEW, OLD, or "" for the row at hand)."""
    of = f"{row}." if row else ""
    return f"{of}day, {of}client IS NOT NULL, IFNULL({of}client, '')"


def _count(row: str, sign: str) -> str:
    """The statement adding (`sign` "+") or taking ("-") ledger row `row` (NEW or OLD) to or from
    its totals row."""
    return f"""
    INSERT INTO paid_totals (day, named, client, spent, carry)
    VALUES ({_key(row)}, {sign}COALESCE({row}.settled, {row}.reserved, 0), 0)
    ON CONFLICT (day, named, client) DO UPDATE SET
        spent = spent + excluded.spent,
        carry = carry + CASE WHEN abs(spent) >= abs(excluded.spent)
            THEN (spent - (spent + excluded.spent)) + excluded.spent
            ELSE (excluded.spent - (spent + excluded.spent)) + spent END;"""


#: In the transaction of every write to the ledger, whoever writes it (this version, an older one
#: sharing the file, an operator's DELETE). An INSERT OR REPLACE that replaces a row would delete
#: it without the DELETE trigger (recursive_triggers is off): no writer here replaces — a
#: reservation's id is fresh, and a reseed keeps a row it finds.
TRIGGERS = (
    f"CREATE TRIGGER paid_totals_insert AFTER INSERT ON paid_ledger BEGIN {_count('NEW', '+')} END",
    "CREATE TRIGGER paid_totals_update AFTER UPDATE OF day, client, reserved, settled "
    f"ON paid_ledger BEGIN {_count('OLD', '-')} {_count('NEW', '+')} END",
    f"CREATE TRIGGER paid_totals_delete AFTER DELETE ON paid_ledger BEGIN {_count('OLD', '-')} END",
)


def migrate(conn: sqlite3.Connection) -> None:
    """Give a file without running totals (new, or made by an older version) the totals of the
    rows it holds and the triggers that keep them. Run inside the schema's immediate transaction
    (`sqlite_file.connect`): of several processes opening the file at once, one creates them and
    the others find them — the totals are filled once."""
    found = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'paid_totals'"
    if conn.execute(found).fetchone() is not None:
        return
    conn.execute(TOTALS)
    rows = conn.execute(
        f"SELECT {_key()}, COALESCE(settled, reserved, 0) FROM paid_ledger ORDER BY 1, 2, 3"
    )
    conn.executemany(  # each sum correctly rounded (fsum): the carry starts at 0
        "INSERT INTO paid_totals (day, named, client, spent, carry) VALUES (?, ?, ?, ?, 0)",
        [
            (*key, math.fsum(r[3] for r in group))
            for key, group in groupby(rows, itemgetter(0, 1, 2))
        ],
    )
    for trigger in TRIGGERS:
        conn.execute(trigger)


def _usd(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    """A ledger amount is a finite, non-negative USD figure: nothing else reaches a store."""
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise ValueError(f"{attribute.name} must be a finite USD amount >= 0, not {value!r}")


def settled_cost(cost: float, reserved: float) -> float:
    """What a settlement may write: the cost, never below 0; a cost that is not a finite number
    keeps the reservation (the ledger never goes below what may be billed)."""
    if not isinstance(cost, (int, float)) or not math.isfinite(cost):
        return reserved
    return max(float(cost), 0.0)


@attrs.frozen(kw_only=True)
class PaidAsk:
    """One paid attempt's reservation request (see `PaidLedger.reserve`)."""

    day: int  # the UTC day (this host's guess: a store with a clock of its own decides it)
    amount: float = attrs.field(validator=_usd)  # USD: the attempt's worst case
    ceiling: float = attrs.field(
        validator=_usd
    )  # USD: the day's ceiling, as this host's config has it
    lane: str
    model: str
    job: str
    cohort: str | None
    client: str | None = None
    client_ceiling: float | None = None  # USD: the client's own ceiling, if it has one
    wall: float | None = None  # this host's wall clock, for a store with a clock of its own
    tolerance_s: float | None = None  # how far that wall may be from the store's clock


class PaidLedger(Protocol):
    """Reserve, settle and read the day's paid spend."""

    def reserve(self, ask: PaidAsk) -> str | None:
        """Reserve `ask.amount` USD of the day's paid budget, atomically across every process and
        host; the reservation's id, or None if it would cross `ask.ceiling` or the store's terms'
        ceiling, whichever is lower — or, for a `client` with a ceiling of its own,
        `client_ceiling`. Raises `StoreUnavailable` while the ledger is not known to be whole and
        `ClockRefused` when `wall` is further than `tolerance_s` from the store's own clock."""

    def settle_paid(self, reservation: str, cost: float) -> None: ...
    def paid_spent(self, day: int, client: str | None = None) -> float: ...


class SQLitePaid(PaidLedger, SQLiteBase):
    """The ledger in the host's SQLite file (the processes of one host share the host's clock,
    which the ledger checks: `wall` and `tolerance_s` are not needed)."""

    # this process's paid reservations of today and yesterday, with what they settled at;
    # written back when the file is found replaced
    _own: dict[str, tuple[PaidAsk, float | None]]

    def reserve(self, ask: PaidAsk) -> str | None:
        reservation = f"{ask.job}:{ask.lane}/{ask.model}:{uuid.uuid4().hex}"  # one per attempt
        self._check_file()
        with self._lock:
            with immediate(self._conn):
                left = room(
                    spent=self._spent(ask.day),
                    ceiling=ceiling_in_force(ask.ceiling, shared_ceiling(self._conn)),
                    client_spent=0.0
                    if ask.client_ceiling is None
                    else self._spent(ask.day, ask.client),
                    client_ceiling=ask.client_ceiling,
                )
                if not fits(ask.amount, left):
                    return None
                self._conn.execute(  # never OR REPLACE: see TRIGGERS
                    "INSERT INTO paid_ledger "
                    "(id, day, reserved, settled, lane, model, job, cohort, client) "
                    "VALUES (?, ?, ?, NULL, ?, ?, ?, ?, ?)",
                    (reservation, ask.day, ask.amount, *_described(ask)),
                )
            if self._path != ":memory:":
                self._own[reservation] = (ask, None)
        return reservation

    def settle_paid(self, reservation: str, cost: float) -> None:
        """Replace a reservation by what the attempt really cost, as reported by its usage."""
        finite = isinstance(cost, (int, float)) and math.isfinite(cost)
        with self._lock, self._conn:
            self._conn.execute(  # not a finite number: the reservation stays (see settled_cost)
                "UPDATE paid_ledger SET settled = COALESCE(MAX(?, 0.0), reserved) WHERE id = ?",
                (cost if finite else None, reservation),
            )
            if reservation in self._own:
                ask = self._own[reservation][0]
                self._own[reservation] = (ask, settled_cost(cost, ask.amount))

    def paid_spent(self, day: int, client: str | None = None) -> float:
        with self._lock:
            return self._spent(day, client)

    def _spent(self, day: int, client: str | None = None) -> float:
        """Reserved-or-settled USD of `day` (unsettled reservations count in full), all clients'
        or one's: from `paid_totals` (the day's few rows, or the client's one). Hold the lock."""
        where, args = (
            ("day = ?", (day,))
            if client is None
            else ("day = ? AND named = 1 AND client = ?", (day, client))
        )
        rows = self._conn.execute(f"SELECT spent, carry FROM paid_totals WHERE {where}", args)
        return math.fsum(usd for row in rows for usd in row)

    def _forget_own(self, now: float) -> None:
        """Only today's and yesterday's reservations can need writing back."""
        day = window_id("day", now)
        with self._lock:
            self._own = {r: own for r, own in self._own.items() if own[0].day >= day - 1}

    def _reseed_paid(self) -> None:
        """This process's own reservations back — inside the reseed's transaction."""
        self._conn.executemany(
            "INSERT OR IGNORE INTO paid_ledger "
            "(id, day, reserved, lane, model, job, cohort, client, settled) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (r, ask.day, ask.amount, *_described(ask), settled)
                for r, (ask, settled) in self._own.items()
            ],
        )


def _described(ask: PaidAsk) -> tuple[Any, ...]:
    """What a `paid_ledger` row says of the attempt: lane, model, job, cohort, client."""
    return ask.lane, ask.model, ask.job, ask.cohort, ask.client


class RedisPaid(PaidLedger, RedisPutBack):
    """The ledger in Redis, shared by every host; the day is the server's."""

    _spent_cache: dict[int, float]  # the day's total, as of the last sync or reservation
    _client_spent: dict[tuple[int, str], float]  # as of this host's last reservation for it
    _settles: dict[str, float]  # settlements waiting for the next flush
    _own: dict[str, tuple[int, float]]  # reservation → (day, amount now counted)
    _kept: LocalRecords  # where `_own` is kept too: this host's file, read again at a restart
    _evicting = ""  # why the server may evict the ledger ("" when it may not): paid stays closed
    _min_replicas = 0  # replicas that must hold a reservation (WAIT) before it is handed out

    @guarded
    def reserve(self, ask: PaidAsk) -> str | None:
        """In one script across every host. The day is the server's (`ask.day` is this host's
        guess; asked again once with the server's when it guessed wrong)."""
        epoch = self._open_epoch()
        client, day = ask.client, ask.day
        tag = client.encode().hex() if ask.client_ceiling is not None and client else ""
        checked = (
            ["", "0"]
            if ask.wall is None or ask.tolerance_s is None
            else [repr(ask.wall), repr(ask.tolerance_s)]
        )
        for _ in range(2):
            # one per attempt, never merged; day and client tag first, so settling finds the ledgers
            reservation = f"{day}:{tag}:{uuid.uuid4().hex}:{ask.job}:{ask.lane}/{ask.model}"
            granted, total, mine, server = self._script(RESERVE)(
                keys=[
                    *self._ledger(day, tag),
                    self._k("ceiling"),
                    self._k("epoch"),
                    self._k("paid-days"),
                ],
                args=[
                    reservation,
                    pico(ask.amount),
                    round(ask.ceiling * PICO),
                    round(ask.client_ceiling * PICO)
                    if tag and ask.client_ceiling is not None
                    else -1,
                    day,
                    *checked,
                    epoch,
                    uuid.uuid4().hex,
                ],
            )
            if int(granted) == -3:
                now = time.monotonic()  # wall-clock: hosts put back in real time
                self._lost_day("the paid ledger of the day was lost", now, float(server))
                raise StoreUnavailable(self._say_closed())
            if int(granted) == -1:
                raise ClockRefused(float(server) - float(checked[0]))
            if int(granted) != -2:
                break
            day = window_id("day", float(server))  # midnight fell between our guess and the script
        else:
            return None  # the server's day changed twice within a call: refuse, never guess
        with self._lock:
            self._spent_cache[day] = int(total) / PICO
            if tag and client:
                self._client_spent[(day, client)] = int(mine) / PICO
            if not int(granted):
                return None
            self._own[reservation] = (day, ask.amount)
        self._kept.keep_reservations({reservation: (day, ask.amount)}, day - 1)
        if self._min_replicas:
            acked = int(self._redis.wait(self._min_replicas, 1000))
            if acked < self._min_replicas:  # never sent: given back at the next flush
                self.settle_paid(reservation, 0.0)
                raise StoreUnavailable(
                    f"redis at {self.where}: a paid reservation reached {acked} of the "
                    f"{self._min_replicas} replica(s) state_redis_min_replicas asks for within 1 s"
                )
        return reservation

    def _open_epoch(self) -> str:
        """The epoch a reservation is made under; StoreUnavailable when paid is closed here (not
        synchronised, an evicting server, or a loss being put back)."""
        if not self.up:
            raise StoreUnavailable(
                f"redis at {self.where}: the shared paid ledger is not synchronised yet"
            )
        if self._evicting:
            raise StoreUnavailable(self._evicting)
        with self._lock:
            if self._put_back.waiting:
                raise StoreUnavailable(self._put_back.why_closed(self.where))
            return self._epoch or ""

    def _prune(self, server_day: int) -> None:
        """Delete the ledgers of the days before the server's yesterday: they carry no expiry (see
        `RESERVE`), and a host only ever reserves, settles or restores today's and yesterday's."""
        kinds = {"paid", "paid-total", "paid-client", "paid-client-total"}
        old = []
        for key in self._redis.scan_iter(match=self._k("paid*"), count=1000):
            kind, _, rest = text(key)[len(self._p) :].partition(":")
            day = rest.partition(":")[0]
            if kind in kinds and day.isdigit() and int(day) < server_day - 1:
                old.append(key)
        for start in range(0, len(old), 500):
            self._redis.delete(*old[start : start + 500])
        marked = self._redis.hkeys(self._k("paid-days"))
        if stale := [d for d in marked if not text(d).isdigit() or int(d) < server_day - 1]:
            self._redis.hdel(self._k("paid-days"), *stale)

    def _ledger(self, day: int | str, tag: str = "") -> list[str]:
        """The day's ledger and total, then the client's (tagged by its hex name; "" for none)."""
        return [
            self._k("paid", day),
            self._k("paid-total", day),
            self._k("paid-client", day, tag),
            self._k("paid-client-total", day, tag),
        ]

    @staticmethod
    def _parts(reservation: str) -> tuple[str, str]:
        """(day, client tag) of a reservation id made here."""
        day, tag, *_ = reservation.split(":", 2)
        return day, tag

    def settle_paid(self, reservation: str, cost: float) -> None:
        """Replace a reservation by its real cost at the next flush (it counts in full until
        then)."""
        with self._lock:
            if reservation not in self._own:
                return  # not one this host made (or one forgotten after two days): no effect
            day, counted = self._own[reservation]
            cost = settled_cost(cost, counted)
            self._own[reservation] = (day, cost)
            self._kept.keep_reservations({reservation: (day, cost)}, day - 1)
            self._settles[reservation] = cost

    def paid_spent(self, day: int, client: str | None = None) -> float:
        """Today's spend as of the last sync or reservation (all hosts); a client's own, when
        named, as of this host's last reservation for it."""
        with self._lock:
            if client is not None:
                return self._client_spent.get((day, client), 0.0)
            return self._spent_cache.get(day, 0.0)

    def _queue_settles(self, pipe: Any, settles: dict[str, float]) -> None:
        for reservation, cost in settles.items():
            self._script(SETTLE)(
                keys=self._ledger(*self._parts(reservation)),
                args=[reservation, pico(cost)],
                client=pipe,
            )

    def _take_totals(self, day: int, totals: list[Any]) -> None:
        """The totals of the days around `day` read by the sync; this host's reservations older
        than yesterday forgotten (only today's and yesterday's can need pushing back). Hold the
        lock."""
        near = (day - 1, day, day + 1)
        self._spent_cache = {d: int(t or 0) / PICO for d, t in zip(near, totals, strict=True)}
        if any(d < day - 1 for d, _ in self._own.values()):
            self._own = {r: (d, amount) for r, (d, amount) in self._own.items() if d >= day - 1}

    def _reseed_paid(self, pipe: Any) -> None:
        """This host's own unexpired reservations back (`RESTORE`), queued on `pipe`. Hold the
        lock."""
        for reservation, (day, amount) in self._own.items():
            tag = self._parts(reservation)[1]
            self._script(RESTORE)(
                keys=self._ledger(day, tag),
                args=[reservation, pico(amount), "1" if tag else "0"],
                client=pipe,
            )

"""A batch's own paid budget (`metadata.lanes_max_paid_usd`): read when the batch is created, and
kept in its record (`lanes.max_paid_usd`, `lanes.paid_usd` settled, `lanes.paid_held_usd` held
by an item's paid try now), inside the queue's transactions.

An item may pay only when free capacity can not serve it within its batch's window (its next free
try would fall at or after the window's end) — one paid item per batch at a time, its worst case
within what is left (the paid gate checks that, and consent `allow`, and the one daily ceiling). A
try held when its process died is counted spent in full by the next leader: the upstream may have
billed it, and the budget, like the ledger, never counts less than that.

The rules are the pure `room_of`, `may_hold` and `spent_of`; the SQLite queue applies them in its
transactions (below), the Redis queue in Lua scripts that say the same (`redis_lua.py`), and one
contract suite checks both.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Mapping
from typing import Any

KEY = "lanes_max_paid_usd"
MAX_USD = 1000.0  # a batch's budget, at most


def budget_of(metadata: Mapping[str, Any]) -> float:
    """The budget `metadata` asks for (0: none). Raises ValueError naming the key."""
    text = metadata.get(KEY)
    if text is None:
        return 0.0
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and 0.0 <= value <= MAX_USD):
        raise ValueError(f"metadata.{KEY} must be a number of dollars from 0 to {MAX_USD:g}")
    return value


def room_of(status: str | None, budget: float, paid: float, held: float) -> float:
    """What is left to hold: nothing while a try holds it, or once the batch is not running."""
    if status != "in_progress" or held > 0:
        return 0.0
    return max(0.0, budget - paid)


def may_hold(status: str | None, budget: float, paid: float, held: float, amount: float) -> bool:
    """Whether one try may hold `amount`: the batch runs, none holds, and it is left."""
    return (
        status == "in_progress"
        and amount > 0
        and not held > 0
        and (paid + amount <= budget + 1e-12)
    )


def spent_of(held: float, cost: float) -> float:
    """What a held try counts when it ends having cost `cost` (not finite: all it held)."""
    return held if not math.isfinite(cost) else max(cost, 0.0)


def _paid(data: Mapping[str, Any]) -> tuple[float, float, float]:
    lanes = data.get("lanes") or {}
    return (
        float(lanes.get("max_paid_usd") or 0.0),
        float(lanes.get("paid_usd") or 0.0),
        float(lanes.get("paid_held_usd") or 0.0),
    )


def _read(conn: sqlite3.Connection, batch: str) -> dict[str, Any] | None:
    row = conn.execute("SELECT data FROM batch WHERE id = ?", (batch,)).fetchone()
    return None if row is None else dict(json.loads(row[0]))


def _write(conn: sqlite3.Connection, data: dict[str, Any], paid: float, held: float) -> None:
    data["lanes"] = {**data.get("lanes", {}), "paid_usd": paid, "paid_held_usd": held}
    conn.execute("UPDATE batch SET data = ? WHERE id = ?", (json.dumps(data), data["id"]))


def room(conn: sqlite3.Connection, batch: str) -> float:
    """What is left of `batch`'s budget to hold (0: none, one item's try holds it now, or the
    batch is no longer running — cancelled, past its window)."""
    data = _read(conn, batch)
    return 0.0 if data is None else room_of(data.get("status"), *_paid(data))


def hold(conn: sqlite3.Connection, batch: str, amount: float) -> bool:
    """Hold `amount` of `batch`'s budget for one item's paid try; False when it is not there."""
    data = _read(conn, batch)
    if data is None or not may_hold(data.get("status"), *_paid(data), amount):
        return False
    _write(conn, data, _paid(data)[1], amount)
    return True


def settle(conn: sqlite3.Connection, batch: str, cost: float) -> float:
    """The held try ended having cost `cost`, as the ledger settled it (not known: all it
    held). Counted as it is — above what it held too, when an upstream billed more than the
    worst case its request allowed; then nothing is left to pay. Returns what it counted."""
    data = _read(conn, batch)
    if data is None:
        return 0.0
    _, paid, held = _paid(data)
    spent = spent_of(held, cost)
    _write(conn, data, paid + spent, 0.0)
    return spent


def count_held(conn: sqlite3.Connection) -> None:
    """A new leader: what the last one held and did not settle (its process died mid-try) is
    counted spent in full."""
    for (raw,) in conn.execute(
        "SELECT data FROM batch WHERE json_extract(data, '$.lanes.paid_held_usd') > 0"
    ).fetchall():
        data = json.loads(raw)
        _, paid, held = _paid(data)
        _write(conn, data, paid + held, 0.0)

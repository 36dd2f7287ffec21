"""What the processes of one host coordinate through the SQLite state file beyond counts and spend:
probe leases, pending approvals, and a change word that tells a process — in about a
microsecond — whether another one wrote a backoff, a kill switch or an approval decision since it
last looked.

**Probe leases.** A cold or reopened scope is probed by one process of the host: the lease is a row
(`probe_lease`: scope, token, expiry in epoch seconds) taken in one short `BEGIN IMMEDIATE`
transaction, refused while another process's lease is unexpired or the scope's backoff is in force.
It is released under its token only — a process whose lease expired can not release the lease
another process took since — in the same transaction that writes the backoff the probe caused
(written first), so no process can take the lease before the closed door is on record. A holder
that dies (SIGKILL) is released by the expiry.

**Pending approvals** are rows (`approval`) written when a job asks for one, listed by every
process, and decided once: the first `UPDATE … WHERE decision IS NULL` wins (see `consent.py`); an
"approve once" is kept in the same transaction (`once_consent`, see `store.py`), for exactly one
request to consume.

**Terms and clocks.** Each process beats at every sync (`host_beat`: its announced terms, its
wall and skew; see `terms.py`); the beat and the store's terms it settles (`shared_terms`: the
ceiling every reservation is held to, and an operator's `lanes ceiling set`) are one immediate
transaction, so no process can settle on a view another is changing.

**The change word** is 8 bytes in a file beside the state file (`<state>-changes`). Every writer of
a backoff, a kill switch or an approval decision writes a new random word there *after* its commit;
a reader compares the word with the last one it saw (one `pread`) and reads the tables only when it
changed. A word that can not be read or written (no such file can be made) says "changed" every
time: the tables are then read on every look (tens of microseconds), never skipped.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from typing import Any

import attrs

from lanes._core.state import terms

SCHEMA = """
CREATE TABLE IF NOT EXISTS probe_lease (scope TEXT PRIMARY KEY, token TEXT, until FLOAT);
CREATE TABLE IF NOT EXISTS approval (
    id TEXT PRIMARY KEY, client TEXT, fingerprint TEXT, data TEXT, expires FLOAT, decision TEXT);
CREATE TABLE IF NOT EXISTS host_beat (host TEXT PRIMARY KEY, data TEXT);
CREATE TABLE IF NOT EXISTS shared_terms (
    id INTEGER PRIMARY KEY CHECK (id = 1), ceiling FLOAT, data TEXT);
"""


@attrs.frozen(kw_only=True)
class ApprovalRecord:
    """A paid fallback waiting for a decision, as every process sharing the store sees it: any of
    them may list and decide it; the processes whose jobs wait on it apply the decision."""

    id: str
    client: str
    fingerprint: str  # the request it is for
    exhausted: tuple[str, ...]  # the free candidates that were held back or failed
    candidate: str  # the paid "lane/model" that will serve if approved
    estimated_cost_usd: float
    created_at: float  # epoch seconds
    expires_at: float  # epoch seconds: the last deadline of the jobs asking for it
    decision: str | None = None  # "once", "deny" or "granted", once decided


BACKOFF_ROW = "SELECT until, step, reason, source FROM backoff WHERE scope = ? AND until > ?"
APPROVAL_COLUMNS = "id, client, fingerprint, data, expires, decision"


class ChangeWord:
    """The word beside the state file that says "another process wrote something to look at"."""

    def __init__(self, path: str | None) -> None:
        self._fd: int | None = None
        self._seen = b""
        if path is None:
            return
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError:
            return
        try:
            if os.fstat(fd).st_size < 8:
                os.ftruncate(fd, 8)  # a no-op if another process got there first
        except OSError:
            os.close(fd)
            return
        self._fd = fd

    def changed(self) -> bool:
        """True when another process wrote since the last call (or this one can not tell)."""
        if self._fd is None:
            return True
        try:
            word = os.pread(self._fd, 8, 0)
        except OSError:
            return True
        if word == self._seen:
            return False
        self._seen = word
        return True

    def bump(self) -> None:
        """Tell the others: call after the commit they must see."""
        if self._fd is not None:
            with contextlib.suppress(OSError):  # they read the tables at their next sync instead
                os.pwrite(self._fd, os.urandom(8), 0)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def take_lease(
    conn: sqlite3.Connection, scope: str, *, token: str, mine: str, until: float, now: float
) -> bool | tuple[Any, ...]:
    """Take the probe lease of `scope` until `until`, in one immediate transaction: True when taken,
    False while another process's lease is unexpired, the backoff row when one is in force. A
    lease whose token starts with `mine` (this process's, its release not written) is taken over."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        backoff = conn.execute(BACKOFF_ROW, (scope, now)).fetchone()
        if backoff is not None:
            return tuple(backoff)
        held = conn.execute(
            "SELECT token FROM probe_lease WHERE scope = ? AND until > ?", (scope, now)
        ).fetchone()
        if held is not None and not str(held[0]).startswith(mine):
            return False
        conn.execute(
            "INSERT OR REPLACE INTO probe_lease (scope, token, until) VALUES (?, ?, ?)",
            (scope, token, until),
        )
        conn.execute("COMMIT")
        return True
    finally:  # whatever happened, the transaction does not outlive the call
        if conn.in_transaction:
            conn.execute("ROLLBACK")


def release_lease(
    conn: sqlite3.Connection, scope: str, token: str, backoff: tuple[Any, ...] | None
) -> None:
    """Write the backoff the probe caused (the later deadline wins), then release the lease if it
    is still the one taken with `token` — one transaction."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        if backoff is not None:
            conn.execute(
                "INSERT INTO backoff (scope, until, step, reason, source) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (scope) DO UPDATE SET until = excluded.until, step = excluded.step, "
                "reason = excluded.reason, source = excluded.source "
                "WHERE excluded.until > backoff.until",
                (scope, *backoff),
            )
        conn.execute("DELETE FROM probe_lease WHERE scope = ? AND token = ?", (scope, token))
        conn.execute("COMMIT")
    finally:
        if conn.in_transaction:
            conn.execute("ROLLBACK")


def put_approval(conn: sqlite3.Connection, row: tuple[Any, ...], now: float) -> None:
    """Write a pending approval (keeping the later expiry and any decision already made), and drop
    the rows that expired a day ago."""
    with conn:
        conn.execute(
            f"INSERT INTO approval ({APPROVAL_COLUMNS}) VALUES (?, ?, ?, ?, ?, NULL) "
            "ON CONFLICT (id) DO UPDATE SET expires = MAX(expires, excluded.expires)",
            row,
        )
        conn.execute("DELETE FROM approval WHERE expires < ?", (now - 86400.0,))


def approvals(conn: sqlite3.Connection, now: float) -> list[tuple[Any, ...]]:
    """Every approval not yet expired, decided or not."""
    return conn.execute(
        f"SELECT {APPROVAL_COLUMNS} FROM approval WHERE expires > ?", (now,)
    ).fetchall()


def decide_approval(
    conn: sqlite3.Connection, approval_id: str, decision: str, now: float
) -> tuple[Any, ...] | None:
    """Record the decision on a pending approval, once — inside the caller's immediate
    transaction, so it is atomic across processes: the row as decided, or None for an unknown,
    expired or already decided approval."""
    changed = conn.execute(
        "UPDATE approval SET decision = ? WHERE id = ? AND decision IS NULL AND expires > ?",
        (decision, approval_id, now),
    ).rowcount
    if not changed:
        return None
    row: tuple[Any, ...] | None = conn.execute(
        f"SELECT {APPROVAL_COLUMNS} FROM approval WHERE id = ?", (approval_id,)
    ).fetchone()
    return row


def approval_row(approval: ApprovalRecord) -> tuple[Any, ...]:
    """An approval as the `approval` table keeps it (what no query filters on, as JSON)."""
    data = {
        "exhausted": list(approval.exhausted),
        "candidate": approval.candidate,
        "cost": approval.estimated_cost_usd,
        "created": approval.created_at,
    }
    return (
        approval.id,
        approval.client,
        approval.fingerprint,
        json.dumps(data),
        approval.expires_at,
    )


def approval_from(row: tuple[Any, ...]) -> ApprovalRecord | None:
    """The inverse of `approval_row` (with its decision); None for a row we can not read."""
    approval_id, client, fingerprint, data, expires, decision = row
    try:
        fields = json.loads(data)
        return ApprovalRecord(
            id=str(approval_id),
            client=str(client),
            fingerprint=str(fingerprint),
            exhausted=tuple(str(k) for k in fields["exhausted"]),
            candidate=str(fields["candidate"]),
            estimated_cost_usd=float(fields["cost"]),
            created_at=float(fields["created"]),
            expires_at=float(expires),
            decision=None if decision is None else str(decision),
        )
    except (ValueError, TypeError, KeyError):
        return None  # a row we can not read is skipped, never fatal


def beat(conn: sqlite3.Connection, one: terms.Beat) -> terms.Pulse:
    """One beat of a process, stamped with its trusted time (the host's clock), and the store's
    terms it settles — one immediate transaction."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        hosts = [
            h
            for host_id, data in conn.execute("SELECT host, data FROM host_beat")
            if (h := terms.host_from(host_id, _json(data))) is not None
        ]
        operator = operator_of(conn)
        own, gone, pulse = terms.beat(hosts, operator, one, one.now)
        conn.execute(
            "INSERT OR REPLACE INTO host_beat (host, data) VALUES (?, ?)",
            (one.host, json.dumps(terms.host_fields(own))),
        )
        conn.executemany("DELETE FROM host_beat WHERE host = ?", [(h,) for h in gone])
        if pulse.settled is not None:
            conn.execute(
                "INSERT INTO shared_terms (id, ceiling) VALUES (1, ?) "
                "ON CONFLICT (id) DO UPDATE SET ceiling = excluded.ceiling",
                (pulse.settled.terms.ceiling_usd,),
            )
        conn.execute("COMMIT")
        return pulse
    finally:
        if conn.in_transaction:
            conn.execute("ROLLBACK")


def set_operator(conn: sqlite3.Connection, op: terms.Operator) -> None:
    """Keep what an operator set: its fields replace the ones already set, the others stay (one
    immediate transaction)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        old = operator_of(conn) or terms.Operator()
        conn.execute(
            "INSERT INTO shared_terms (id, data) VALUES (1, ?) "
            "ON CONFLICT (id) DO UPDATE SET data = excluded.data",
            (json.dumps(terms.operator_fields(terms.merged(old, op))),),
        )
        conn.execute("COMMIT")
    finally:
        if conn.in_transaction:
            conn.execute("ROLLBACK")


def shared_ceiling(conn: sqlite3.Connection) -> float | None:
    """The ceiling the store's terms hold every reservation to (None: none settled yet)."""
    row = conn.execute("SELECT ceiling FROM shared_terms WHERE id = 1").fetchone()
    return None if row is None or row[0] is None else float(row[0])


def operator_of(conn: sqlite3.Connection) -> terms.Operator | None:
    row = conn.execute("SELECT data FROM shared_terms WHERE id = 1").fetchone()
    return None if row is None or row[0] is None else terms.operator_from(_json(row[0]))


def _json(text: Any) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}

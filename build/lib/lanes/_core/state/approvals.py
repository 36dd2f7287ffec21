"""Pending approvals and the "approve once" decisions they keep, shared by every process (or host).

The rules, on both backends, each one atomic step:

- a pending approval is listed by everyone; writing it again keeps the later expiry and never
  undoes a decision; rows expired a day ago are dropped;
- it is decided once: the first decision wins, an unknown, expired or decided one is refused;
- a "once" decision keeps its `OnceConsent` in the same step, so whoever sees the decision finds
  it; a once is consumed by exactly one request — of its client, for the very request approved
  (fingerprint) on its model, whose worst case is at most the approved one (the one named first);
  expired ones are dropped, and one kept without its cost (an older version's) never matches.

SQLite: rows (`approval`, `once_consent`), in `BEGIN IMMEDIATE` transactions. Redis: two hashes
(`lanes:approval`, `lanes:once`) of JSON, changed by Lua (`PUT_APPROVAL`, `DECIDE_APPROVAL`,
`TAKE_ONCE`).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import attrs

from lanes._core.state.backend import RedisBase, SQLiteBase, guarded, text
from lanes._core.state.redis_scripts import DECIDE_APPROVAL, PUT_APPROVAL, TAKE_ONCE
from lanes._core.state.sqlite_file import immediate

SCHEMA = """
CREATE TABLE IF NOT EXISTS approval (
    id TEXT PRIMARY KEY, client TEXT, fingerprint TEXT, data TEXT, expires FLOAT, decision TEXT);
CREATE TABLE IF NOT EXISTS once_consent (
    id TEXT PRIMARY KEY, client TEXT, fingerprint TEXT, candidate TEXT, until FLOAT,
    cost_usd FLOAT);
"""
APPROVAL_COLUMNS = "id, client, fingerprint, data, expires, decision"
R = TypeVar("R")


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


@attrs.frozen(kw_only=True)
class OnceConsent:
    """An "approve once", kept from its decision until one request consumes it (or `until`, epoch
    seconds): a job of `client` for the very request approved (`fingerprint`) on `candidate`,
    whose worst case is at most the approved `cost_usd` — the first waiting job, or the client's
    retry."""

    id: str  # the approval's id
    client: str
    fingerprint: str  # the request approved (`Job.request_fingerprint`)
    candidate: str  # the paid "lane/model" approved
    until: float
    cost_usd: float | None = None  # the approved worst case; None (an older version's): no match


@attrs.frozen(kw_only=True)
class OnceClaim:
    """A request that would pay with an "approve once" (see `Approvals.claim_once`)."""

    client: str
    candidate: str  # the paid "lane/model" it would use
    fingerprint: str  # the request (`Job.request_fingerprint`)
    cost: float  # USD: its worst case
    approval: str | None  # the approval it names (a retry's), taken first
    now: float  # epoch seconds: onces that ended by then are dropped


class Approvals(Protocol):
    """Pending approvals, their decisions, and the onces they keep."""

    def put_approval(self, approval: ApprovalRecord, now: float) -> None: ...
    def approvals(self, now: float) -> list[ApprovalRecord]: ...
    def decide_approval(
        self, approval_id: str, decision: str, now: float, once_until: float | None = None
    ) -> ApprovalRecord | None: ...
    def put_once(self, once: OnceConsent) -> None: ...
    def claim_once(self, claim: OnceClaim) -> str | None:
        """Consume, atomically across every process and host, an "approve once" of `client` for
        this very request (`fingerprint`) on `candidate`, approved for a worst case of at least
        `cost` USD — the one named `approval` first; its id, or None. Expired ones are dropped."""

    def onces(self, now: float) -> list[OnceConsent]: ...
    def drop_once(self, once_id: str) -> bool: ...


def once_of(approval: ApprovalRecord, until: float) -> OnceConsent:
    """The "approve once" an approval's decision keeps: its request, model and worst case."""
    return OnceConsent(
        id=approval.id,
        client=approval.client,
        fingerprint=approval.fingerprint,
        candidate=approval.candidate,
        until=until,
        cost_usd=approval.estimated_cost_usd,
    )


def approval_row(approval: ApprovalRecord) -> tuple[Any, ...]:
    """An approval as the `approval` table keeps it (what no query filters on, as JSON)."""
    data = {
        "exhausted": list(approval.exhausted),
        "candidate": approval.candidate,
        "cost": approval.estimated_cost_usd,
        "created": approval.created_at,
    }
    return approval.id, approval.client, approval.fingerprint, json.dumps(data), approval.expires_at


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


def _insert_once(conn: sqlite3.Connection, once: OnceConsent) -> None:
    conn.execute(
        "INSERT OR REPLACE INTO once_consent "
        "(id, client, fingerprint, candidate, until, cost_usd) VALUES (?, ?, ?, ?, ?, ?)",
        (once.id, once.client, once.fingerprint, once.candidate, once.until, once.cost_usd),
    )


class SQLiteApprovals(Approvals, SQLiteBase):
    """Approvals and onces in the host's SQLite file."""

    def put_approval(self, approval: ApprovalRecord, now: float) -> None:
        """Write a pending approval (keeping the later expiry and any decision already made), and
        drop the rows that expired a day ago."""
        with self._lock, self._conn:
            self._conn.execute(
                f"INSERT INTO approval ({APPROVAL_COLUMNS}) VALUES (?, ?, ?, ?, ?, NULL) "
                "ON CONFLICT (id) DO UPDATE SET expires = MAX(expires, excluded.expires)",
                approval_row(approval),
            )
            self._conn.execute("DELETE FROM approval WHERE expires < ?", (now - 86400.0,))

    def approvals(self, now: float) -> list[ApprovalRecord]:
        """Every approval not yet expired, decided or not."""
        with self._lock:
            rows = self._conn.execute(
                f"SELECT {APPROVAL_COLUMNS} FROM approval WHERE expires > ?", (now,)
            ).fetchall()
        return [r for row in rows if (r := approval_from(row)) is not None]

    def decide_approval(
        self, approval_id: str, decision: str, now: float, once_until: float | None = None
    ) -> ApprovalRecord | None:
        """Decide a pending approval once, atomically across processes; the approval as decided,
        or None when it is unknown, expired or decided already. A "once" with `once_until` keeps
        its `OnceConsent` in the same transaction, so a process that sees the decision finds it."""
        with self._lock, immediate(self._conn) as conn:
            changed = conn.execute(
                "UPDATE approval SET decision = ? WHERE id = ? AND decision IS NULL "
                "AND expires > ?",
                (decision, approval_id, now),
            ).rowcount
            row = (
                conn.execute(
                    f"SELECT {APPROVAL_COLUMNS} FROM approval WHERE id = ?", (approval_id,)
                ).fetchone()
                if changed
                else None
            )
            decided = None if row is None else approval_from(row)
            if decided is not None and decision == "once" and once_until is not None:
                _insert_once(conn, once_of(decided, once_until))
        if row is None:
            return None
        self._word.bump()
        return decided

    def put_once(self, once: OnceConsent) -> None:
        """Keep an "approve once" decision for the client's next matching request."""
        with self._lock, self._conn:
            _insert_once(self._conn, once)

    def claim_once(self, claim: OnceClaim) -> str | None:
        """In one immediate transaction."""
        with self._lock, immediate(self._conn) as conn:
            conn.execute("DELETE FROM once_consent WHERE until <= ?", (claim.now,))
            named = claim.approval or ""  # taken first
            row = conn.execute(
                "SELECT id FROM once_consent WHERE client = ? AND candidate = ? "
                "AND fingerprint = ? AND cost_usd IS NOT NULL AND cost_usd + 1e-12 >= ? "
                "ORDER BY id = ? DESC LIMIT 1",
                (claim.client, claim.candidate, claim.fingerprint, claim.cost, named),
            ).fetchone()
            if row is not None:
                conn.execute("DELETE FROM once_consent WHERE id = ?", (row[0],))
        return None if row is None else str(row[0])

    def onces(self, now: float) -> list[OnceConsent]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT id, client, fingerprint, candidate, until, cost_usd FROM once_consent "
                "WHERE until > ?",
                (now,),
            ).fetchall()
        return [
            OnceConsent(id=i, client=c, fingerprint=f, candidate=k, until=u, cost_usd=usd)
            for i, c, f, k, u, usd in rows
        ]

    def drop_once(self, once_id: str) -> bool:
        with self._lock, self._conn:
            return (
                self._conn.execute("DELETE FROM once_consent WHERE id = ?", (once_id,)).rowcount > 0
            )


def _approval_json(approval: ApprovalRecord) -> str:
    approval_id, client, fingerprint, data, expires = approval_row(approval)
    return json.dumps(
        {
            "id": approval_id,
            "client": client,
            "fingerprint": fingerprint,
            "data": data,
            "expires": repr(expires),  # as text: Lua's cjson would round a number to 14 digits
        }
    )


def _approval_parse(value: object) -> ApprovalRecord | None:
    """An approval as kept in Redis; None for a value we can not read."""
    try:
        one = json.loads(text(value))
        row = (one["id"], one["client"], one["fingerprint"], one["data"], one["expires"])
    except (ValueError, TypeError, KeyError):
        return None
    return approval_from((*row, one.get("decision")))


def _once_parse(value: object) -> OnceConsent | None:
    """An "approve once" as kept in Redis (numbers as text, when a script wrote it); None for a
    value we can not read."""
    try:
        one = json.loads(text(value))
        cost = one.get("cost_usd")
        return OnceConsent(
            id=str(one["id"]),
            client=str(one["client"]),
            fingerprint=str(one["fingerprint"]),
            candidate=str(one["candidate"]),
            until=float(one["until"]),
            cost_usd=None if cost is None else float(cost),
        )
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


class RedisApprovals(Approvals, RedisBase):
    """Approvals and onces in Redis, shared by every host."""

    @guarded
    def put_approval(self, approval: ApprovalRecord, now: float) -> None:
        self._script(PUT_APPROVAL)(
            keys=[self._k("approval")],
            args=[approval.id, _approval_json(approval), repr(now - 86400.0)],
        )

    @guarded
    def approvals(self, now: float) -> list[ApprovalRecord]:
        return [a for a in self._readable("approval", _approval_parse) if a.expires_at > now]

    @guarded
    def decide_approval(
        self, approval_id: str, decision: str, now: float, once_until: float | None = None
    ) -> ApprovalRecord | None:
        decided = self._script(DECIDE_APPROVAL)(
            keys=[self._k("approval"), self._k("once")],
            args=[approval_id, decision, repr(now), "" if once_until is None else repr(once_until)],
        )
        return _approval_parse(decided) if decided else None

    @guarded
    def put_once(self, once: OnceConsent) -> None:
        self._redis.hset(self._k("once"), once.id, json.dumps(attrs.asdict(once)))

    @guarded
    def claim_once(self, claim: OnceClaim) -> str | None:
        """In one script (`TAKE_ONCE`)."""
        taken = self._script(TAKE_ONCE)(
            keys=[self._k("once")],
            args=[
                claim.client,
                claim.candidate,
                claim.fingerprint,
                repr(claim.cost),
                claim.approval or "",
                repr(claim.now),
            ],
        )
        return text(taken) if taken else None

    @guarded
    def onces(self, now: float) -> list[OnceConsent]:
        return [once for once in self._readable("once", _once_parse) if once.until > now]

    def _readable(self, name: str, parse: Callable[[object], R | None]) -> list[R]:
        """The values of the hash `name` that `parse` can read (the others are skipped)."""
        return [
            one for value in self._redis.hvals(self._k(name)) if (one := parse(value)) is not None
        ]

    @guarded
    def drop_once(self, once_id: str) -> bool:
        return bool(self._redis.hdel(self._k("once"), once_id))

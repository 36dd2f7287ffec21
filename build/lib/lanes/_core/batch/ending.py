"""A batch's record in the SQLite queue and how it ends (inside the queue's transactions): its
items counted as they change state, those never run answered for (expired, cancelled) in the
batch's own format, its counts and its output and error files written as it ends.

Each batch's items are counted by state in `batch_count` — `pending`, `running`, and the done
ones by outcome: `ok`, `error`, `expired`, `cancelled` — in the transaction that changes them, so
a round of the runner reads one row per running batch, never its items (`ending`), and
`request_counts` is read from the row (`completed` = ok; `failed` = the rest done).
"""

from __future__ import annotations

import json
import sqlite3

from lanes._core.batch.lines import closed_line
from lanes._core.batch.queue import COUNTS, Obj, ending_of, new_id

COUNT_SCHEMA = """
CREATE TABLE IF NOT EXISTS batch_count (
    batch TEXT PRIMARY KEY, pending INTEGER NOT NULL DEFAULT 0, running INTEGER NOT NULL DEFAULT 0,
    ok INTEGER NOT NULL DEFAULT 0, error INTEGER NOT NULL DEFAULT 0,
    expired INTEGER NOT NULL DEFAULT 0, cancelled INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID
"""
#: A queue of an older version counted its items as it read them: its batches' counts, once.
RECOUNT = """
INSERT INTO batch_count (batch, pending, running, ok, error, expired, cancelled)
SELECT b.id, count(i.line) FILTER (WHERE i.state = 'pending'),
    count(i.line) FILTER (WHERE i.state = 'running'),
    count(i.line) FILTER (WHERE i.state = 'done' AND i.outcome = 'ok'),
    count(i.line) FILTER (WHERE i.state = 'done' AND i.outcome = 'error'),
    count(i.line) FILTER (WHERE i.state = 'done' AND i.outcome = 'expired'),
    count(i.line) FILTER (WHERE i.state = 'done' AND i.outcome = 'cancelled')
FROM batch b LEFT JOIN batch_item i ON i.batch = b.id
WHERE b.id NOT IN (SELECT batch FROM batch_count) GROUP BY b.id
"""


SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS batch_file (
    id TEXT PRIMARY KEY, client TEXT NOT NULL, purpose TEXT NOT NULL, filename TEXT NOT NULL,
    bytes INTEGER NOT NULL, lines INTEGER NOT NULL, created_at INTEGER NOT NULL,
    batch TEXT, kind TEXT NOT NULL, deleted INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS batch (
    id TEXT PRIMARY KEY, client TEXT NOT NULL, data TEXT NOT NULL, status TEXT NOT NULL,
    expires_at INTEGER NOT NULL, created_at INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS idx_batch_client ON batch (client, created_at);
CREATE INDEX IF NOT EXISTS idx_batch_status ON batch (status);
CREATE TABLE IF NOT EXISTS batch_item (
    batch TEXT NOT NULL, line INTEGER NOT NULL, custom_id TEXT NOT NULL, start INTEGER NOT NULL,
    length INTEGER NOT NULL, state TEXT NOT NULL, ok INTEGER, outcome TEXT, result BLOB,
    tries INTEGER NOT NULL
    DEFAULT 0, not_before REAL NOT NULL DEFAULT 0, expires_at INTEGER NOT NULL,
    PRIMARY KEY (batch, line), UNIQUE (batch, custom_id)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idx_batch_item_due ON batch_item (state, expires_at, not_before);
CREATE INDEX IF NOT EXISTS idx_batch_item_order ON batch_item (state, expires_at, batch, line);
CREATE INDEX IF NOT EXISTS idx_batch_item_next ON batch_item (batch, state, not_before);
DROP INDEX IF EXISTS idx_batch_item_left;
CREATE TABLE IF NOT EXISTS batch_lead (id INTEGER PRIMARY KEY CHECK (id = 1), owner TEXT,
    until REAL);
CREATE TABLE IF NOT EXISTS batch_hold (batch TEXT PRIMARY KEY, until REAL NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS batch_model (batch TEXT PRIMARY KEY, model TEXT NOT NULL) WITHOUT ROWID;
"""
    + COUNT_SCHEMA
)

#: A batch's record and its `request_counts`' done parts, from its kept counts (`with_counts`).
WITH_COUNTS = (
    "SELECT b.data, c.ok, c.error + c.expired + c.cancelled FROM batch b "
    "LEFT JOIN batch_count c ON c.batch = b.id"
)


def recount(conn: sqlite3.Connection) -> None:
    """A queue of an older version: its batches' items counted once (see `ending.RECOUNT`)."""
    conn.execute(RECOUNT)


def bump(conn: sqlite3.Connection, batch: str, **change: int) -> None:
    """Add `change` (count → difference) to `batch`'s kept counts."""
    sets = ", ".join(f"{name} = {name} + ?" for name in change if name in COUNTS)
    conn.execute(f"UPDATE batch_count SET {sets} WHERE batch = ?", (*change.values(), batch))


def kept(conn: sqlite3.Connection, batch: str) -> dict[str, int]:
    """`batch`'s kept counts (zeros when it has none)."""
    row = conn.execute(
        f"SELECT {', '.join(COUNTS)} FROM batch_count WHERE batch = ?", (batch,)
    ).fetchone()
    return dict(zip(COUNTS, row or (0,) * len(COUNTS), strict=True))


def ending(conn: sqlite3.Connection, data: Obj, now: float, counts: dict[str, int]) -> str | None:
    """How `data`'s batch ends now (None: not yet); the items left are answered for."""
    status, close_as = ending_of(data["status"], data["expires_at"], counts, now)
    if close_as is not None and counts.get("pending"):
        close_left(conn, data, close_as)
    return status


def close_left(conn: sqlite3.Connection, data: Obj, why: str) -> None:
    """The items not run yet answered for: expired or cancelled, in the batch's own format."""
    rows = conn.execute(
        "SELECT line, custom_id FROM batch_item WHERE batch = ? AND state = 'pending'",
        (data["id"],),
    ).fetchall()
    for line, custom_id in rows:
        result = closed_line(data["endpoint"], f"{data['id']}-{line}", custom_id, why)
        conn.execute(
            "UPDATE batch_item SET state = 'done', ok = 0, outcome = ?, result = ? "
            "WHERE batch = ? AND line = ?",
            (why, result, data["id"], line),
        )
    bump(conn, data["id"], pending=-len(rows), **{why: len(rows)})


def end(conn: sqlite3.Connection, data: Obj, status: str, now: int) -> None:
    counts = kept(conn, data["id"])
    done = {1: counts["ok"], 0: counts["error"] + counts["expired"] + counts["cancelled"]}
    data["request_counts"] |= {"completed": done[1], "failed": done[0]}
    data |= {"status": status, f"{status}_at": now, "finalizing_at": now}
    for kind, has in (("output", done[1]), ("error", done[0])):
        if has:
            file_id = new_id("file-")
            conn.execute(
                "INSERT INTO batch_file (id, client, purpose, filename, bytes, lines, created_at, "
                "batch, kind) VALUES (?, (SELECT client FROM batch WHERE id = ?), "
                "'batch_output', ?, (SELECT coalesce(sum(length(result)), 0) FROM batch_item "
                "WHERE batch = ? AND ok = ?), ?, ?, ?, ?)",
                (file_id, data["id"], f"{data['id']}_{kind}.jsonl", data["id"],
                 int(kind == "output"), has, now, data["id"], kind),
            )  # fmt: skip
            data[f"{kind}_file_id"] = file_id
    write(conn, data)


def with_counts(raw: str, ok: int | None, failed: int | None) -> Obj:
    """A batch's stored record with its `request_counts` from its kept counts."""
    data: Obj = json.loads(raw)
    if ok is not None and failed is not None:
        data["request_counts"] |= {"completed": ok, "failed": failed}
    return data


def write(conn: sqlite3.Connection, data: Obj) -> None:
    conn.execute(
        "UPDATE batch SET data = ?, status = ? WHERE id = ?",
        (json.dumps(data), data["status"], data["id"]),
    )


def tally(conn: sqlite3.Connection) -> dict[str, dict[str, int]]:
    """What the queue holds now: its batches by status, and their items by state — `pending`,
    `running`, `completed`, `failed` (expired and cancelled items among them, as
    `request_counts` counts them)."""
    batches = dict(conn.execute("SELECT status, count(*) FROM batch GROUP BY status").fetchall())
    row = conn.execute(
        "SELECT sum(pending), sum(running), sum(ok), sum(error + expired + cancelled) "
        "FROM batch_count"
    ).fetchone()
    names = ("pending", "running", "completed", "failed")
    return {"batches": batches, "items": {k: int(v or 0) for k, v in zip(names, row, strict=True)}}

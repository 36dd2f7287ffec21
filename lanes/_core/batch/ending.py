"""A batch's record and how it ends (inside the queue's transactions): its items left counted,
those never run answered for (expired, cancelled) in the batch's own format, its counts and its
output and error files written as it ends."""

from __future__ import annotations

import json
import secrets
import sqlite3
from typing import Any

from lanes._core.batch.lines import closed_line

Obj = dict[str, Any]  # a file or batch object, as OpenAI's API has it


def new_id(prefix: str) -> str:
    """A new object id: `prefix` and 96 random bits."""
    return f"{prefix}{secrets.token_hex(12)}"


def ending(conn: sqlite3.Connection, data: Obj, now: float) -> str | None:
    """How `data`'s batch ends now (None: not yet); the items left are answered for."""
    left = dict(
        conn.execute(
            "SELECT state, count(*) FROM batch_item WHERE batch = ? AND state IN ('pending', "
            "'running') GROUP BY state",
            (data["id"],),
        ).fetchall()
    )
    if data["status"] == "cancelling":
        if left.get("running"):
            return None
        close_left(conn, data, "cancelled")
        return "cancelled"
    if now >= data["expires_at"] and not left.get("running"):
        close_left(conn, data, "expired")
        return "expired" if left else "completed"
    return None if left else "completed"


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


def end(conn: sqlite3.Connection, data: Obj, status: str, now: int) -> None:
    counts = dict(
        conn.execute(
            "SELECT ok, count(*) FROM batch_item WHERE batch = ? AND state = 'done' GROUP BY ok",
            (data["id"],),
        ).fetchall()
    )
    data["request_counts"] |= {"completed": counts.get(1, 0), "failed": counts.get(0, 0)}
    data |= {"status": status, f"{status}_at": now, "finalizing_at": now}
    for kind, has in (("output", counts.get(1)), ("error", counts.get(0))):
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


def count(conn: sqlite3.Connection, batch: str, field: str) -> None:
    row = conn.execute("SELECT data FROM batch WHERE id = ?", (batch,)).fetchone()
    if row is not None:
        data = json.loads(row[0])
        data["request_counts"][field] += 1
        write(conn, data)


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
    (running,) = conn.execute("SELECT count(*) FROM batch_item WHERE state = 'running'").fetchone()
    total = completed = failed = 0
    for t, c, f in conn.execute(
        "SELECT json_extract(data, '$.request_counts.total'), json_extract(data, "
        "'$.request_counts.completed'), json_extract(data, '$.request_counts.failed') FROM batch"
    ):
        total, completed, failed = total + (t or 0), completed + (c or 0), failed + (f or 0)
    pending = max(0, total - completed - failed - running)
    items = {"pending": pending, "running": running, "completed": completed, "failed": failed}
    return {"batches": batches, "items": items}

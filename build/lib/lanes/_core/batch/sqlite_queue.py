"""The SQLite batch queue: files, batches and their items in one SQLite file beside the state
(the contract is `queue.py`'s).

The one place request bodies are stored on a host whose state is SQLite: an uploaded input file is
kept as it came, in the queue's folder, and an item is its line's place in it (offset and length)
— read when the item runs, never all in memory. An item's answer is written in the same statement
that marks it done, so a crash or restart loses no item and answers none twice; an item taken by a
process that died is taken again by the next leader (`lead`). Output and error files are the done
items' lines, streamed from the table in line order (`lines_of`). Files and batches are a client's
own: another client's id is not found.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from lanes._core.batch import budget
from lanes._core.batch.ending import (
    SCHEMA,
    WITH_COUNTS,
    bump,
    end,
    ending,
    kept,
    recount,
    tally,
    with_counts,
    write,
)
from lanes._core.batch.files import SQLiteBatchFiles, in_use
from lanes._core.batch.lines import ENDPOINTS, MAX_ERRORS, Line, LineError
from lanes._core.batch.queue import (
    COUNTS,
    TERMINAL,
    Caps,
    Item,
    Obj,
    asked,
    check_input,
    check_open,
    created,
    duplicate,
    lines_in,
    new_batch,
    new_id,
)
from lanes._core.state.sqlite_file import connect, immediate


class SQLiteBatchQueue(SQLiteBatchFiles):
    """Files, batches and items in `folder` (`queue.db` and `files/`). Blocking: call it from a
    worker thread. `durable` False: the folder is temporary and the objects say so."""

    def __init__(self, folder: Path, caps: Caps, *, durable: bool = True) -> None:
        self.folder, self.caps, self.durable = folder, caps, durable
        (folder / "files").mkdir(parents=True, exist_ok=True)
        self._conn = connect(str(folder / "queue.db"), SCHEMA, recount)
        self._lock = threading.Lock()

    def close(self) -> None:
        self._conn.close()

    # -- batches ------------------------------------------------------------------------------
    def create(
        self,
        client: str,
        ask: Mapping[str, Any],
        now: int,
        *,
        endpoints: tuple[str, ...] = ENDPOINTS,
        purpose: str = "batch",
        prefix: str = "batch_",
        default_budget: float = 0.0,
    ) -> Obj:
        """A batch over one of this client's input files: every line read first; a bad line
        makes it `failed` at once with OpenAI's `errors` list, and nothing runs. Raises
        BatchRefused for a request OpenAI refuses (an unknown file, endpoint or window).
        Anthropic's Message Batches come through here too (`endpoints` ("/v1/messages",), their
        own `purpose` and id `prefix`)."""
        checked = asked(ask, endpoints, default_budget)
        check_input(self.file(client, checked.input_id), checked.input_id, purpose)
        with self._lock:
            (open_now,) = self._conn.execute(
                "SELECT count(*) FROM batch WHERE client = ? AND status NOT IN ('completed', "
                "'failed', 'expired', 'cancelled')",
                (client,),
            ).fetchone()
        check_open(open_now, self.caps)
        batch_id = new_id(prefix)
        data = new_batch(batch_id, checked, ask["completion_window"], now, durable=self.durable)
        expires_at = now + checked.window_s
        with self._lock, immediate(self._conn) as conn:  # the items, the batch and its counts
            errors, total = self._take_items(conn, batch_id, checked, expires_at)
            created(data, errors, total, now)
            conn.execute(
                "INSERT INTO batch (id, client, data, status, expires_at, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (batch_id, client, json.dumps(data), data["status"], expires_at, now),
            )
            conn.execute(
                "INSERT INTO batch_count (batch, pending) VALUES (?, ?)",
                (batch_id, 0 if errors else total),
            )
        return data

    def _take_items(
        self, conn: sqlite3.Connection, batch: str, ask: Any, expires_at: int
    ) -> tuple[list[LineError], int]:
        """Every line of the file, as items of `batch` (in the caller's transaction), and how many;
        the bad lines instead, and no item, when there is one."""
        errors: list[LineError] = []
        total, models = 0, set[str]()
        with self._path(ask.input_id).open("rb") as stream:
            for number, begin, size, line in lines_in(
                stream, ask.endpoint, self.caps.max_line_bytes
            ):
                found: Line | LineError = line
                if isinstance(line, Line):  # kept while bad lines are looked for: duplicates
                    if len(models) < 2:
                        models.add(line.body["model"])
                    try:
                        conn.execute(
                            "INSERT INTO batch_item (batch, line, custom_id, start, length, "
                            "state, expires_at) VALUES (?, ?, ?, ?, ?, 'pending', ?)",
                            (batch, number, line.custom_id, begin, size, expires_at),
                        )
                        total += 1
                    except sqlite3.IntegrityError:
                        found = duplicate(number, line.custom_id)
                if isinstance(found, LineError) and len(errors) < MAX_ERRORS:
                    errors.append(found)
            if errors:
                conn.execute("DELETE FROM batch_item WHERE batch = ?", (batch,))
            elif len(models) == 1:  # one model: its items are held back together (`hold`)
                conn.execute("INSERT INTO batch_model (batch, model) VALUES (?, ?)",
                             (batch, *models))  # fmt: skip
        return errors, total

    def batch(self, client: str, batch_id: str) -> Obj | None:
        with self._lock:
            row = self._conn.execute(
                f"{WITH_COUNTS} WHERE b.id = ? AND b.client = ?", (batch_id, client)
            ).fetchone()
        return None if row is None else with_counts(*row)

    def batches(
        self, client: str, limit: int, after: str | None, endpoints: tuple[str, ...] = ENDPOINTS
    ) -> list[Obj]:
        """This client's batches on `endpoints`, newest first, after the id `after`."""
        marks = ", ".join("?" * len(endpoints))
        with self._lock:
            rows = self._conn.execute(
                f"{WITH_COUNTS} WHERE b.client = ? AND json_extract(b.data, '$.endpoint') "
                f"IN ({marks}) AND (? IS NULL OR (b.created_at, b.id) < (SELECT created_at, id "
                "FROM batch WHERE id = ? AND client = ?)) ORDER BY b.created_at DESC, b.id DESC "
                "LIMIT ?",
                (client, *endpoints, after, after, client, limit),
            ).fetchall()
        return [with_counts(*r) for r in rows]

    def open_batches(self, client: str | None, limit: int) -> list[Obj]:
        """The batches not ended of `client` (None: of every client), the soonest window's end
        first, at most `limit` — each with `next_try_at`: when its next item may run (None:
        none waits)."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT b.data, c.ok, c.error + c.expired + c.cancelled, max((SELECT "
                "min(not_before) FROM batch_item WHERE batch = b.id AND state = 'pending'), "
                "coalesce((SELECT until FROM batch_hold WHERE batch = b.id), 0)) FROM "
                "batch b LEFT JOIN batch_count c ON c.batch = b.id WHERE b.status IN "
                "('validating', 'in_progress', 'finalizing', 'cancelling') AND (? IS NULL OR "
                "b.client = ?) ORDER BY b.expires_at LIMIT ?",
                (client, client, limit),
            ).fetchall()
        return [
            with_counts(raw, ok, failed) | {"next_try_at": due} for raw, ok, failed, due in rows
        ]

    def outcomes(self, batch_id: str) -> dict[str, int]:
        """How a batch's items ended so far: ok, error, expired, cancelled."""
        with self._lock:
            counts = kept(self._conn, batch_id)
        return {k: counts[k] for k in ("ok", "error", "expired", "cancelled")}

    def results(self, client: str, batch_id: str) -> Iterator[bytes] | None:
        """Every answered item's line, in line order (Anthropic's one results file); None when
        the batch is not this client's."""
        return None if self.batch(client, batch_id) is None else self._lines_of(batch_id, ok=None)

    def purge(self, ended_before: float) -> int:
        """Delete the batches that ended before `ended_before` (`batch.retention_days`), with
        their items, their output and error files and their input file: the request bodies go
        with them. How many were deleted."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT id, client FROM batch WHERE status IN ('completed', 'failed', 'expired', "
                "'cancelled') AND coalesce(json_extract(data, '$.completed_at'), json_extract("
                "data, '$.failed_at'), json_extract(data, '$.expired_at'), json_extract(data, "
                "'$.cancelled_at')) < ? LIMIT 1000",
                (ended_before,),
            ).fetchall()
        return sum(bool(self.delete_batch(client, batch_id)) for batch_id, client in rows)

    def delete_batch(self, client: str, batch_id: str) -> bool | None:
        """Delete an ended batch of this client's, its items and files: True; False when it has
        not ended; None when it is not this client's."""
        data = self.batch(client, batch_id)
        if data is None:
            return None
        if data["status"] not in TERMINAL:
            return False
        with self._lock, self._conn:
            self._conn.execute("DELETE FROM batch_item WHERE batch = ?", (batch_id,))
            self._conn.execute("DELETE FROM batch_count WHERE batch = ?", (batch_id,))
            self._conn.execute("DELETE FROM batch_hold WHERE batch = ?", (batch_id,))
            self._conn.execute("DELETE FROM batch_model WHERE batch = ?", (batch_id,))
            self._conn.execute("DELETE FROM batch WHERE id = ?", (batch_id,))
            self._conn.execute(
                "UPDATE batch_file SET deleted = 1 WHERE batch = ? OR id = ?",
                (batch_id, data["input_file_id"]),
            )
            shared = in_use(self._conn, data["input_file_id"])  # goes when that batch ends
        if not shared:
            self._path(data["input_file_id"]).unlink(missing_ok=True)
        return True

    def cancel(self, client: str, batch_id: str, now: int) -> Obj | None:
        """`cancelling`: no item is taken any more; `cancelled` once none is running. A batch
        already ended is returned as it is."""
        with self._lock, immediate(self._conn) as conn:
            row = conn.execute(
                f"{WITH_COUNTS} WHERE b.id = ? AND b.client = ?", (batch_id, client)
            ).fetchone()
            if row is None:
                return None
            data = with_counts(*row)
            if data["status"] in ("validating", "in_progress"):
                data |= {"status": "cancelling", "cancelling_at": now}
                write(conn, data)
        self.settle(now)
        return self.batch(client, batch_id)

    # -- the runner's side ----------------------------------------------------------------------
    def lead(
        self, owner: str, now: float, ttl_s: float, gone: Callable[[str], bool] = lambda _: False
    ) -> bool:
        """Take or keep the queue's one lease (only its holder runs items). A new holder takes
        back the items the last one left running: its process died (`gone` says so of a holder
        on this host, before its lease runs out) or lost the lease."""
        with self._lock, immediate(self._conn) as conn:
            row = conn.execute("SELECT owner, until FROM batch_lead WHERE id = 1").fetchone()
            if row is not None and row[0] != owner and row[1] > now and not gone(row[0]):
                return False
            conn.execute(
                "INSERT OR REPLACE INTO batch_lead (id, owner, until) VALUES (1, ?, ?)",
                (owner, now + ttl_s),
            )
            if row is None or row[0] != owner:
                conn.execute("UPDATE batch_item SET state = 'pending' WHERE state = 'running'")
                conn.execute(
                    "UPDATE batch_count SET pending = pending + running, running = 0 "
                    "WHERE running > 0"
                )
                budget.count_held(conn)  # a paid try the last leader did not settle: spent
        return True

    def paid_room(self, batch: str) -> float:
        """What is left of the batch's own paid budget (see `budget.py`)."""
        with self._lock:
            return budget.room(self._conn, batch)

    def hold_paid(self, batch: str, amount: float) -> bool:
        with self._lock, immediate(self._conn) as conn:
            return budget.hold(conn, batch, amount)

    def settle_paid(self, batch: str, cost: float) -> float:
        with self._lock, immediate(self._conn) as conn:
            return budget.settle(conn, batch, cost)

    def take(self, now: float, limit: int) -> list[Item]:
        """Up to `limit` items due now, of running batches, the earliest window end first."""
        with self._lock, immediate(self._conn) as conn:
            rows = conn.execute(
                "SELECT i.batch, i.line, i.custom_id, json_extract(b.data, '$.endpoint'), "
                "b.client, i.start, i.length, i.expires_at, json_extract(b.data, "
                "'$.input_file_id'), i.tries + 1, m.model FROM batch_item i JOIN batch b ON "
                "b.id = i.batch LEFT JOIN batch_model m ON m.batch = i.batch "
                "WHERE i.state = 'pending' AND i.not_before <= ? AND b.status = 'in_progress' "
                "AND i.expires_at > ? AND NOT EXISTS (SELECT 1 FROM batch_hold h WHERE h.batch = "
                "i.batch AND h.until > ?) ORDER BY i.expires_at, i.batch, i.line LIMIT ?",
                (now, now, now, limit),
            ).fetchall()
            conn.executemany(
                "UPDATE batch_item SET state = 'running', tries = tries + 1 "
                "WHERE batch = ? AND line = ?",
                [(r[0], r[1]) for r in rows],
            )
            for batch in {r[0] for r in rows}:
                n = sum(r[0] == batch for r in rows)
                bump(conn, batch, pending=-n, running=n)
        return [
            Item(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], str(self._path(r[8])), r[9], r[10])
            for r in rows
        ]

    def body(self, item: Item) -> bytes:
        """The item's line, read from its input file."""
        with open(item.source, "rb") as stream:
            stream.seek(item.start)
            return stream.read(item.length)

    def finish(self, item: Item, *, ok: bool, line: bytes) -> None:
        """The item's answer (a line of the output file, or of the error file), written in the
        statement that marks it done, and only while this run has it (its `tries`): the late
        answer of a run whose item was taken back is not; its batch's counts follow."""
        with self._lock, immediate(self._conn) as conn:
            done = conn.execute(
                "UPDATE batch_item SET state = 'done', ok = ?, outcome = ?, result = ? "
                "WHERE batch = ? AND line = ? AND state = 'running' AND tries = ?",
                (int(ok), "ok" if ok else "error", line, item.batch, item.line, item.tries),
            ).rowcount
            if done:
                bump(conn, item.batch, running=-1, **{"ok" if ok else "error": 1})

    def later(self, item: Item, not_before: float) -> None:
        """Put an item back (this run's: its `tries`), not to be taken before `not_before` (its
        free capacity resets)."""
        with self._lock, immediate(self._conn) as conn:
            back = conn.execute(
                "UPDATE batch_item SET state = 'pending', not_before = ? "
                "WHERE batch = ? AND line = ? AND state = 'running' AND tries = ?",
                (not_before, item.batch, item.line, item.tries),
            ).rowcount
            if back:
                bump(conn, item.batch, running=-1, pending=1)

    def tally(self) -> dict[str, dict[str, int]]:
        """Batches by status and items by state (see `ending.tally`)."""
        with self._lock:
            return tally(self._conn)

    def hold(self, batch: str, until: float) -> None:
        """None of `batch`'s items is taken before `until` (its items, of one model, were told
        to wait for a quota's reset)."""
        with self._lock, immediate(self._conn) as conn:
            conn.execute("INSERT OR REPLACE INTO batch_hold (batch, until) VALUES (?, ?)",
                         (batch, until))  # fmt: skip

    def next_due(self, now: float) -> float | None:
        """When the next pending item may be taken (None: none is pending)."""
        with self._lock:
            row = self._conn.execute(  # per running batch, its soonest: an index's first row
                "SELECT min(max((SELECT min(not_before) FROM batch_item WHERE batch = b.id AND "
                "state = 'pending'), ?, coalesce((SELECT until FROM batch_hold WHERE batch = "
                "b.id), 0))) FROM batch b WHERE b.status = 'in_progress'",
                (now,),
            ).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def settle(self, now: float) -> list[str]:
        """End what is over: a batch past its window `expired` (its items left get the error
        file's `batch_expired`), a cancelling one with nothing running `cancelled`, a running one
        with nothing left `completed` — each with its output and error files. The ids ended."""
        ended = []
        with self._lock, immediate(self._conn) as conn:
            rows = conn.execute(  # a row per running batch: its counts are kept, not counted
                f"SELECT b.data, {', '.join('c.' + k for k in COUNTS)} FROM batch b JOIN "
                "batch_count c ON c.batch = b.id WHERE b.status IN ('in_progress', 'cancelling')"
            ).fetchall()
            for raw, *counted in rows:
                data = json.loads(raw)
                status = ending(conn, data, now, dict(zip(COUNTS, counted, strict=True)))
                if status is not None:
                    end(conn, data, status, int(now))
                    ended.append(data["id"])
            gone = [
                r[0]
                for i in ended
                for r in conn.execute(
                    "SELECT id FROM batch_file WHERE id = (SELECT json_extract(data, "
                    "'$.input_file_id') FROM batch WHERE id = ?) AND deleted = 1",
                    (i,),
                )
                if not in_use(conn, r[0])
            ]
        for file_id in gone:  # deleted while its batch ran: its bodies go now
            self._path(file_id).unlink(missing_ok=True)
        return ended

"""The SQLite batch queue's files: uploads kept as they came in the queue's folder, each client's
own, bounded as they are taken (bytes, lines, bytes per line, files per client); output and error
files are their batch's items' lines, streamed in line order. The queue (`sqlite_queue.py`) is
built on it."""

from __future__ import annotations

import os
import secrets
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

from lanes._core.batch.queue import BatchRefused, Caps, Obj, counted, file_object, new_id


class SQLiteBatchFiles:
    """Files of the queue in `folder` (`files/`), rows in its SQLite file (the queue's)."""

    folder: Path
    caps: Caps
    _conn: sqlite3.Connection
    _lock: threading.Lock

    # -- files --------------------------------------------------------------------------------
    def upload_path(self) -> Path:
        """Where an upload is written as it arrives (then `add_file`, or deleted)."""
        return self.folder / "files" / f"upload-{secrets.token_hex(8)}.part"

    def add_file(
        self,
        client: str,
        purpose: str,
        filename: str,
        upload: Path,
        now: int,
        purposes: tuple[str, ...] = ("batch",),
    ) -> Obj:
        """Keep an uploaded JSONL file (`upload`, as written). Raises BatchRefused when it is not
        JSONL within the caps, or its purpose is not one of `purposes`."""
        if purpose not in purposes:
            upload.unlink(missing_ok=True)
            raise BatchRefused(f"purpose must be {' or '.join(purposes)}", param="purpose")
        with self._lock:
            (kept,) = self._conn.execute(
                "SELECT count(*) FROM batch_file WHERE client = ? AND deleted = 0 AND kind = "
                "'input'",
                (client,),
            ).fetchone()
        if kept >= self.caps.max_files:
            upload.unlink(missing_ok=True)
            raise BatchRefused(
                f"this client keeps {self.caps.max_files} files already: delete one first",
                param="file",
            )
        size = upload.stat().st_size
        try:
            lines = counted(upload, self.caps)
        except BatchRefused:
            upload.unlink(missing_ok=True)
            raise
        file_id = new_id("file-")
        os.replace(upload, self._path(file_id))
        row = (file_id, client, purpose, filename[:255] or "batch.jsonl", size, lines, now)
        with self._lock, self._conn:
            self._conn.execute(
                "INSERT INTO batch_file (id, client, purpose, filename, bytes, lines, created_at, "
                "kind) VALUES (?, ?, ?, ?, ?, ?, ?, 'input')",
                row,
            )
        return self.file(client, file_id) or {}

    def file(self, client: str, file_id: str) -> Obj | None:
        """The file object, or None when it is not this client's (or deleted)."""
        with self._lock:
            row = self._conn.execute(
                "SELECT id, bytes, created_at, filename, purpose, kind FROM batch_file "
                "WHERE id = ? AND client = ? AND deleted = 0",
                (file_id, client),
            ).fetchone()
        return None if row is None else file_object(*row)

    def files(self, client: str, limit: int, after: str | None) -> list[Obj]:
        """This client's files, newest first, after the id `after`."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT id, bytes, created_at, filename, purpose, kind FROM batch_file "
                "WHERE client = ? AND deleted = 0 AND purpose = 'batch' AND (? IS NULL OR "
                "created_at < (SELECT created_at FROM batch_file WHERE id = ? AND client = ?) OR "
                "(created_at = (SELECT created_at FROM batch_file WHERE id = ? AND client = ?) "
                "AND id < ?)) ORDER BY created_at DESC, id DESC LIMIT ?",
                (client, after, after, client, after, client, after, limit),
            ).fetchall()
        return [file_object(*r) for r in rows]

    def delete_file(self, client: str, file_id: str) -> bool:
        """Delete a file of this client's: its bytes at once (an input file a batch still runs
        from is kept until the batch ends). False when it is not this client's."""
        with self._lock, self._conn:
            row = self._conn.execute(
                "SELECT kind, batch FROM batch_file WHERE id = ? AND client = ? AND deleted = 0",
                (file_id, client),
            ).fetchone()
            if row is None:
                return False
            self._conn.execute("UPDATE batch_file SET deleted = 1 WHERE id = ?", (file_id,))
            if row[0] != "input":  # an output or error file: its lines go with it
                self._conn.execute(
                    "UPDATE batch_item SET result = NULL WHERE batch = ? AND ok = ?",
                    (row[1], int(row[0] == "output")),
                )
            running = in_use(self._conn, file_id)
        if row[0] == "input" and not running:
            self._path(file_id).unlink(missing_ok=True)
        return True

    def content(self, client: str, file_id: str) -> Iterator[bytes] | None:
        """A file's bytes in chunks: an input file as uploaded, an output or error file as its
        items' lines in line order. None when it is not this client's."""
        with self._lock:
            row = self._conn.execute(
                "SELECT kind, batch FROM batch_file WHERE id = ? AND client = ? AND deleted = 0",
                (file_id, client),
            ).fetchone()
        if row is None:
            return None
        kind, batch = row
        if kind == "input":
            return _chunks(self._path(file_id))
        return self._lines_of(batch, ok=kind == "output")

    def _lines_of(self, batch: str, *, ok: bool | None) -> Iterator[bytes]:
        """The done items' lines in line order, 500 at a time: the answered (`ok`), the failed,
        or (None) all."""
        last = 0
        while True:
            with self._lock:
                rows = self._conn.execute(
                    "SELECT line, result FROM batch_item WHERE batch = ? AND state = 'done' AND "
                    "(? IS NULL OR ok = ?) AND line > ? ORDER BY line LIMIT 500",
                    (batch, None if ok is None else int(ok), None if ok is None else int(ok), last),
                ).fetchall()
            if not rows:
                return
            yield b"".join(r[1] for r in rows if r[1] is not None)  # a deleted file's: none
            last = rows[-1][0]

    def _path(self, file_id: str) -> Path:
        return self.folder / "files" / f"{file_id}.jsonl"


def in_use(conn: sqlite3.Connection, file_id: str) -> bool:
    """Whether a batch not ended runs from the input file `file_id`."""
    return bool(conn.execute(
        "SELECT 1 FROM batch WHERE status NOT IN ('completed', 'failed', 'expired', 'cancelled') "
        "AND json_extract(data, '$.input_file_id') = ?",
        (file_id,),
    ).fetchone())  # fmt: skip


def _chunks(path: Path, size: int = 1 << 16) -> Iterator[bytes]:
    with path.open("rb") as stream:
        while chunk := stream.read(size):
            yield chunk

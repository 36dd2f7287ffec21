"""The Redis batch queue's files: an upload, written to a local scratch file as it arrives
(bounded there by the doors), is counted within the caps and copied into Redis in chunks
(`chunk:<id>:<n>`, `chunk_bytes` each: never more than one in memory); an item's body is read back
as the byte range of its line (GETRANGE of the chunks it spans); output and error files are their
batch's answered lines, read from Redis in line order, 500 at a time. The queue
(`redis_queue.py`) is built on it; the keys are drawn in `redis_lua.py`.
"""

from __future__ import annotations

import io
import math
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lanes._core.batch.queue import BatchRefused, Caps, Item, Obj, counted, file_object, new_id
from lanes._core.batch.redis_lua import ADD_FILE, DELETE_FILE

PAGE = 500  # lines read (or chunks deleted) at a time
OK_LETTERS, ERROR_LETTERS = b"o", b"exc"  # a done item's outcome: ok; error, expired, cancelled


def member(line: int) -> str:
    """A line's member in the queue's sets and hashes: 10 digits, so they sort as numbers."""
    return f"{line:010d}"


class RedisBatchFiles:
    """Files of the queue in Redis (and its uploads in progress in a local scratch folder)."""

    caps: Caps
    _r: Any  # redis-py's client, replies as bytes
    _p: str  # the queue's key prefix
    _scratch: Path
    _chunk: int  # bytes per chunk of an input file
    _scripts: dict[str, Any]

    def _k(self, *parts: object) -> str:
        return self._p + ":".join(str(p) for p in parts)

    def _run(self, lua: str, *args: object) -> Any:
        """Run one of `redis_lua`'s scripts (its prefix first)."""
        script = self._scripts.get(lua)
        if script is None:
            script = self._scripts[lua] = self._r.register_script(lua)
        return script(keys=[], args=[self._p, *args])

    # -- files --------------------------------------------------------------------------------
    def upload_path(self) -> Path:
        """Where an upload is written as it arrives (then `add_file`, or deleted)."""
        return self._scratch / f"upload-{secrets.token_hex(8)}.part"

    def add_file(
        self,
        client: str,
        purpose: str,
        filename: str,
        upload: Path,
        now: int,
        purposes: tuple[str, ...] = ("batch",),
    ) -> Obj:
        """Keep an uploaded JSONL file (`upload`, as written; deleted either way). Raises
        BatchRefused when it is not JSONL within the caps, or its purpose is not one of
        `purposes`."""
        full = f"this client keeps {self.caps.max_files} files already: delete one first"
        try:
            if purpose not in purposes:
                raise BatchRefused(f"purpose must be {' or '.join(purposes)}", param="purpose")
            if self._r.scard(self._k("inputs", client)) >= self.caps.max_files:
                raise BatchRefused(full, param="file")
            lines, size = counted(upload, self.caps), upload.stat().st_size
            file_id = new_id("file-")
            self._put_chunks(file_id, upload)
            name = filename[:255] or "batch.jsonl"
            args = (file_id, client, purpose, name, size, lines, now, self.caps.max_files)
            if not self._run(ADD_FILE, *args, int(purpose == "batch")):
                self._drop_chunks(file_id, size)  # another upload of the client's came first
                raise BatchRefused(full, param="file")
        finally:
            upload.unlink(missing_ok=True)
        return self.file(client, file_id) or {}

    def _put_chunks(self, file_id: str, upload: Path) -> None:
        pipe = self._r.pipeline(transaction=False)
        with upload.open("rb") as stream:
            for n, chunk in enumerate(iter(lambda: stream.read(self._chunk), b"")):
                pipe.set(self._k("chunk", file_id, n), chunk)
                if n % 8 == 7:
                    pipe.execute()
        pipe.execute()

    def _drop_chunks(self, file_id: str, size: int) -> None:
        keys = [self._k("chunk", file_id, n) for n in range(math.ceil(size / self._chunk))]
        for at in range(0, len(keys), PAGE):
            self._r.unlink(*keys[at : at + PAGE])

    def file(self, client: str, file_id: str) -> Obj | None:
        """The file object, or None when it is not this client's (or deleted)."""
        row = self._r.hmget(self._k("file", file_id), "client", "deleted", "bytes", "created_at",
                            "filename", "purpose")  # fmt: skip
        if row[0] is None or row[0].decode() != client or row[1] == b"1":
            return None
        return file_object(file_id, int(row[2]), int(row[3]), row[4].decode(), row[5].decode())

    def files(self, client: str, limit: int, after: str | None) -> list[Obj]:
        """This client's files, newest first, after the id `after` (an unknown one: none)."""
        key, start = self._k("files", client), 0
        if after is not None:
            rank = self._r.zrevrank(key, after)
            if rank is None:
                return []
            start = rank + 1
        ids = [i.decode() for i in self._r.zrevrange(key, start, start + limit - 1)]
        return [f for f in (self.file(client, i) for i in ids) if f is not None]

    def delete_file(self, client: str, file_id: str) -> bool:
        """Delete a file of this client's: its bytes at once (an input file a batch still runs
        from is kept until the batch ends; an output or error file's lines are dropped from its
        batch's answers). False when it is not this client's."""
        found = self._run(DELETE_FILE, file_id, client)
        if not found:
            return False
        kind, batch, size = (v.decode() for v in found)
        if kind == "input":
            self._drop_input(file_id, int(size or 0))
        else:
            self._strip(batch, OK_LETTERS if kind == "output" else ERROR_LETTERS)
        return True

    def _drop_input(self, file_id: str, size: int) -> None:
        """A deleted input file's bytes and record, unless a batch still runs from it."""
        if not self._in_use(file_id):
            self._drop_chunks(file_id, size)
            self._r.unlink(self._k("file", file_id))

    def _in_use(self, file_id: str) -> bool:
        """Whether a batch not ended runs from the input file `file_id`."""
        pipe = self._r.pipeline(transaction=False)
        for batch in self._r.zrange(self._k("open"), 0, -1):
            pipe.hget(self._k("batch", batch.decode()), "input_file_id")
        return file_id.encode() in pipe.execute()

    def _strip(self, batch: str, letters: bytes) -> None:
        """The answered lines of `batch` whose outcome is one of `letters` dropped (their
        outcome kept): an output or error file deleted."""
        done = self._k("done", batch)
        for lines, values in self._pages(batch):
            pipe = self._r.pipeline(transaction=False)
            for line, value in zip(lines, values, strict=True):
                if value is not None and value[:1] in letters:
                    pipe.hset(done, line, value[:1])
            pipe.execute()

    def content(self, client: str, file_id: str) -> Iterator[bytes] | None:
        """A file's bytes in chunks: an input file as uploaded, an output or error file as its
        items' lines in line order. None when it is not this client's."""
        row = self._r.hmget(self._k("file", file_id), "client", "deleted", "kind", "batch",
                            "bytes")  # fmt: skip
        if row[0] is None or row[0].decode() != client or row[1] == b"1":
            return None
        if row[2] == b"input":
            return self._chunks_of(file_id, int(row[4]))
        return self._lines_of(row[3].decode(), ok=row[2] == b"output")

    def _chunks_of(self, file_id: str, size: int) -> Iterator[bytes]:
        for n in range(math.ceil(size / self._chunk)):
            yield self._r.get(self._k("chunk", file_id, n)) or b""

    def _pages(self, batch: str) -> Iterator[tuple[list[str], list[bytes | None]]]:
        """`batch`'s done lines, `PAGE` line numbers at a time: (the members, their values)."""
        last = int(self._r.hget(self._k("batch", batch), "last_line") or 0)
        for first in range(1, last + 1, PAGE):
            lines = [member(n) for n in range(first, min(first + PAGE, last + 1))]
            yield lines, self._r.hmget(self._k("done", batch), lines)

    def _lines_of(self, batch: str, *, ok: bool | None) -> Iterator[bytes]:
        """The done items' lines in line order: the answered (`ok`), the failed, or (None)
        all."""
        letters = b"oexc" if ok is None else OK_LETTERS if ok else ERROR_LETTERS
        for _, values in self._pages(batch):
            found = b"".join(v[1:] for v in values if v is not None and v[:1] in letters)
            if found:
                yield found

    def body(self, item: Item) -> bytes:
        """The item's line, read from its input file's chunks (`item.source`: its id)."""
        first, last = item.start // self._chunk, (item.start + item.length - 1) // self._chunk
        pipe = self._r.pipeline(transaction=False)
        for n in range(first, last + 1):
            begin = item.start - n * self._chunk if n == first else 0
            end = item.start + item.length - 1 - n * self._chunk if n == last else self._chunk - 1
            pipe.getrange(self._k("chunk", item.source, n), begin, end)
        return b"".join(pipe.execute())

    def _reader(self, file_id: str) -> io.BufferedReader:
        """An input file's bytes as a stream, read a chunk at a time."""
        size = int(self._r.hget(self._k("file", file_id), "bytes") or 0)
        return io.BufferedReader(_Chunks(self._chunks_of(file_id, size)), 1 << 16)


class _Chunks(io.RawIOBase):
    """Raw bytes from an iterator of chunks (for `io.BufferedReader`)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks, self._held, self._at = chunks, memoryview(b""), 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while self._at >= len(self._held):
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._held, self._at = memoryview(chunk), 0
        n = min(len(buffer), len(self._held) - self._at)
        buffer[:n] = self._held[self._at : self._at + n]
        self._at += n
        return n

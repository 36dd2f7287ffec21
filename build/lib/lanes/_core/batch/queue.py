"""The batch queue's contract: what the runner and the doors ask of it, and the rules its two
halves share.

- `BatchBudget` — `paid_room`, `hold_paid`, `settle_paid`: a paid try (`budget.py`'s rules);
- `RunnerQueue` — and `lead`, `settle`, `purge`, `take`, `body`, `finish`, `later`,
  `next_due`, `tally`: what the runner asks;
- `BatchQueue` — and files, batches, `cancel`, `results`, `outcomes`, `open_batches`, `close`:
  what the doors ask.

`SQLiteBatchQueue` (`sqlite_queue.py`) keeps files, batches and items in a SQLite file and a
folder beside the state: the processes of one host share it. `RedisBatchQueue`
(`redis_queue.py`) keeps them in the Redis state store, request bodies included: every host of a
deployment shares one queue. One contract suite runs over both (`tests/test_batch_queue.py`);
its atomic rules:

- an item's answer is written in the step that marks it done, and only by the run that has it
  (its `tries`): the late answer of a leader that lost the queue is not written, even when the
  item runs again, so no item is answered twice;
- one leader at a time (`lead`); a new one takes back the items the last one left running, and
  counts a paid try it held and did not settle as spent in full;
- each batch's items are counted by state in the steps that change them, so a round reads a
  batch's counts, never its items;
- a batch's paid budget is held one try at a time and never held past what is left.

Blocking: call a queue from a worker thread. Errors: `BatchRefused` (a request the API refuses,
with its status and the field to name); the store's own (`sqlite3.Error`, redis-py's) otherwise.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import attrs

from lanes._core.batch import budget
from lanes._core.batch.lines import ENDPOINTS, Line, LineError, read_line, window_s

Obj = dict[str, Any]  # a file or batch object, as OpenAI's API has it
TERMINAL = ("completed", "failed", "expired", "cancelled")
OPEN = ("validating", "in_progress", "finalizing", "cancelling")
COUNTS = ("pending", "running", "ok", "error", "expired", "cancelled")  # a batch's kept counts


class BatchRefused(ValueError):
    """A file or batch request that can not be taken, with the status and the field to name."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param = status, param


@attrs.frozen(kw_only=True)
class Caps:
    """What a file may hold (`[batch]`): bytes, lines, bytes per line; what a client may keep."""

    max_bytes: int
    max_lines: int
    max_line_bytes: int
    max_files: int = 100  # a client's files kept at once (delete one to upload another)
    max_open: int = 100  # a client's batches not ended yet


@attrs.frozen
class Item:
    """One item taken to run: where its body is (`source`: its input file's path, or its id in
    Redis; `start` and `length` in bytes), and what it answers for."""

    batch: str
    line: int
    custom_id: str
    endpoint: str
    client: str
    start: int
    length: int
    expires_at: int
    source: str
    tries: int = 1  # this run included
    model: str | None = None  # the model every item of its batch names (None: several)


class BatchBudget(Protocol):
    """A batch's own paid budget, one item's paid try at a time (`budget.py`)."""

    def paid_room(self, batch: str) -> float: ...
    def hold_paid(self, batch: str, amount: float) -> bool: ...
    def settle_paid(self, batch: str, cost: float) -> float: ...


class RunnerQueue(BatchBudget, Protocol):
    """What the runner asks: the lease, the items due, their answers, the ends of batches."""

    def lead(
        self, owner: str, now: float, ttl_s: float, gone: Callable[[str], bool] = ...
    ) -> bool: ...
    def settle(self, now: float) -> list[str]: ...
    def purge(self, ended_before: float) -> int: ...
    def take(self, now: float, limit: int) -> list[Item]: ...
    def body(self, item: Item) -> bytes: ...
    def finish(self, item: Item, *, ok: bool, line: bytes) -> None: ...
    def later(self, item: Item, not_before: float) -> None: ...
    def next_due(self, now: float) -> float | None: ...
    def hold(self, batch: str, until: float) -> None: ...
    def tally(self) -> dict[str, dict[str, int]]: ...


class BatchQueue(RunnerQueue, Protocol):
    """The whole queue: the runner's side and the doors' (files, batches, their results)."""

    @property
    def caps(self) -> Caps: ...
    def upload_path(self) -> Path: ...
    def add_file(
        self, client: str, purpose: str, filename: str, upload: Path, now: int,
        purposes: tuple[str, ...] = ...,
    ) -> Obj: ...  # fmt: skip
    def file(self, client: str, file_id: str) -> Obj | None: ...
    def files(self, client: str, limit: int, after: str | None) -> list[Obj]: ...
    def content(self, client: str, file_id: str) -> Iterator[bytes] | None: ...
    def delete_file(self, client: str, file_id: str) -> bool: ...
    def create(
        self, client: str, ask: Mapping[str, Any], now: int, *, endpoints: tuple[str, ...] = ...,
        purpose: str = ..., prefix: str = ..., default_budget: float = ...,
    ) -> Obj: ...  # fmt: skip
    def batch(self, client: str, batch_id: str) -> Obj | None: ...
    def batches(
        self, client: str, limit: int, after: str | None, endpoints: tuple[str, ...] = ...
    ) -> list[Obj]: ...
    def open_batches(self, client: str | None, limit: int) -> list[Obj]: ...
    def outcomes(self, batch_id: str) -> dict[str, int]: ...
    def results(self, client: str, batch_id: str) -> Iterator[bytes] | None: ...
    def cancel(self, client: str, batch_id: str, now: int) -> Obj | None: ...
    def delete_batch(self, client: str, batch_id: str) -> bool | None: ...
    def close(self) -> None: ...


# -- the rules both halves share ---------------------------------------------------------------
def new_id(prefix: str) -> str:
    """A new object id: `prefix` and 96 random bits."""
    return f"{prefix}{secrets.token_hex(12)}"


def ending_of(
    status: str, expires_at: float, counts: Mapping[str, int], now: float
) -> tuple[str | None, str | None]:
    """How a batch of `status` whose window ends at `expires_at` ends now, from its kept
    `counts`: (its end, what its items left are answered as), or (None, None): not yet. Pure."""
    pending, running = counts.get("pending", 0), counts.get("running", 0)
    if status == "cancelling":
        return (None, None) if running else ("cancelled", "cancelled")
    if now >= expires_at and not running:  # an item closed as expired already: a resumed end
        return ("expired" if pending or counts.get("expired") else "completed"), "expired"
    return (None, None) if pending or running else ("completed", None)


@attrs.frozen
class Asked:
    """A batch request as checked before its file is looked at."""

    endpoint: str
    window_s: int
    metadata: dict[str, str]
    paid_usd: float
    input_id: str


def asked(
    ask: Mapping[str, Any], endpoints: tuple[str, ...] = ENDPOINTS, default_budget: float = 0.0
) -> Asked:
    """`ask` (a `POST /v1/batches` body) checked; a batch whose metadata names no budget has
    `default_budget` (its client's). Raises BatchRefused naming the field."""
    endpoint = ask.get("endpoint")
    if not isinstance(endpoint, str) or endpoint not in endpoints:
        raise BatchRefused(f"endpoint must be one of {', '.join(endpoints)}", param="endpoint")
    try:
        window = window_s(ask.get("completion_window"))
    except ValueError as exc:
        raise BatchRefused(str(exc), param="completion_window") from None
    metadata, paid = _metadata(ask.get("metadata"))
    if budget.KEY not in metadata:
        paid = default_budget
    input_id = ask.get("input_file_id")
    if not isinstance(input_id, str) or not input_id:
        raise BatchRefused("input_file_id must name an uploaded file", param="input_file_id")
    return Asked(endpoint, window, metadata, paid, input_id)


def check_input(found: Obj | None, input_id: str, purpose: str) -> None:
    """The input file a batch names must be the client's, of the batch's `purpose`."""
    if found is None or found["purpose"] != purpose or not found["id"].startswith("file-"):
        raise BatchRefused(f"no file {input_id!r}", status=404, param="input_file_id")


def check_open(open_now: int, caps: Caps) -> None:
    """A client keeps at most `caps.max_open` batches not ended."""
    if open_now >= caps.max_open:
        raise BatchRefused(
            f"this client has {caps.max_open} batches not ended yet: wait for one, or cancel one"
        )


def new_batch(batch_id: str, ask: Asked, window: str, now: int, *, durable: bool = True) -> Obj:
    """A batch's object as it is created (`validating`, no item counted yet)."""
    data: Obj = {
        "id": batch_id, "object": "batch", "endpoint": ask.endpoint, "errors": None,
        "input_file_id": ask.input_id, "completion_window": window,
        "status": "validating", "output_file_id": None, "error_file_id": None,
        "created_at": now, "in_progress_at": None, "expires_at": now + ask.window_s,
        "finalizing_at": None, "completed_at": None, "failed_at": None, "expired_at": None,
        "cancelling_at": None, "cancelled_at": None,
        "request_counts": {"total": 0, "completed": 0, "failed": 0},
        "metadata": dict(ask.metadata),
    }  # fmt: skip
    if ask.paid_usd:
        data["lanes"] = {"max_paid_usd": ask.paid_usd, "paid_usd": 0.0, "paid_held_usd": 0.0}
    if not durable:
        data["lanes"] = {**data.get("lanes", {}), "durable": False}
    return data


def created(data: Obj, errors: list[LineError], total: int, now: int) -> None:
    """`data` as its lines left it: `failed` with OpenAI's `errors` list, or `in_progress`."""
    if errors:
        data |= {"status": "failed", "failed_at": now, "errors": {
            "object": "list", "data": [e.entry() for e in errors]}}  # fmt: skip
    else:
        data |= {"status": "in_progress", "in_progress_at": now}
        data["request_counts"]["total"] = total


def file_object(
    file_id: str, size: int, created_at: int, filename: str, purpose: str, *_: Any
) -> Obj:
    return {
        "id": file_id, "object": "file", "bytes": size, "created_at": created_at,
        "filename": filename, "purpose": purpose, "status": "processed", "expires_at": None,
        "status_details": None,
    }  # fmt: skip


def bounded_lines(stream: Any, cap: int) -> Iterator[tuple[bytes | None, int]]:
    """Each line of `stream` and its size in bytes, never holding more than `cap` + 1 bytes of
    one: a longer line is read past in chunks and given as None."""
    while True:
        raw = stream.readline(cap + 1)
        if not raw:
            return
        if len(raw) <= cap or raw.endswith(b"\n"):
            yield raw, len(raw)
            continue
        size = len(raw)
        while raw and not raw.endswith(b"\n"):
            raw = stream.readline(1 << 16)
            size += len(raw)
        yield None, size


def counted(upload: Path, caps: Caps) -> int:
    """The lines of an uploaded file (`upload`), read within the caps. Raises BatchRefused when
    it holds more than `caps.max_lines`, or none."""
    lines = 0
    with upload.open("rb") as stream:
        for raw, _ in bounded_lines(stream, caps.max_line_bytes):
            lines += raw is None or bool(raw.strip())
            if lines > caps.max_lines:
                raise BatchRefused(
                    f"the file holds more than batch.max_lines ({caps.max_lines}) lines",
                    param="file",
                )
    if not lines:
        raise BatchRefused("the file holds no line: a batch file is JSONL", param="file")
    return lines


def lines_in(
    stream: BinaryIO, endpoint: str, cap: int
) -> Iterator[tuple[int, int, int, Line | LineError]]:
    """Each line of an input file that is not blank: (its number, 1-based; where it starts and
    its size, bytes; the line, or why it can not run)."""
    start, number = 0, 0
    for raw, size in bounded_lines(stream, cap):
        number, begin, start = number + 1, start, start + size
        if raw is not None and not raw.strip():
            continue
        if raw is None:
            message = f"the line is over the {cap}-byte cap per line"
            yield number, begin, size, LineError(number, "request_too_large", message)
        else:
            yield number, begin, size, read_line(raw, number, endpoint, cap)


def duplicate(number: int, custom_id: str) -> LineError:
    return LineError(number, "duplicate_custom_id",
                     f"custom_id {custom_id!r} is on an earlier line", "custom_id")  # fmt: skip


def _metadata(metadata: object) -> tuple[dict[str, str], float]:
    """A batch's `metadata` as OpenAI bounds it, and the paid budget it asks for (0: none).
    Raises BatchRefused naming the field."""
    metadata = {} if metadata is None else metadata
    if (
        not isinstance(metadata, dict)
        or len(metadata) > 16
        or not all(isinstance(v, str) and len(k) <= 64 and len(v) <= 512
                   for k, v in metadata.items())
    ):  # fmt: skip
        raise BatchRefused(
            "metadata must be an object of at most 16 keys (64 characters) with string "
            "values (512 characters)",
            param="metadata",
        )
    try:
        return dict(metadata), budget.budget_of(metadata)
    except ValueError as exc:
        raise BatchRefused(str(exc), param=f"metadata.{budget.KEY}") from None

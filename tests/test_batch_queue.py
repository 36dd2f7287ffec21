"""The batch queue's contract: its kept counts (each batch's items by state, kept in the
transactions that change them, so a round of the runner reads a row per running batch and not its
items) always equal a full recount of the items, whatever happened — batches created, items taken,
answered, put back, cancelled, expired, a leader dying with items running, batches deleted."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import examples
from lanes._core.batch.queue import Caps
from lanes._core.batch.sqlite_queue import SQLiteBatchQueue

CAPS = Caps(max_bytes=1_000_000, max_lines=100, max_line_bytes=10_000, max_files=1000,
            max_open=1000)  # fmt: skip
COUNTS = ("pending", "running", "ok", "error", "expired", "cancelled")


def line(custom_id: str) -> str:
    body = {"model": "m", "messages": [{"role": "user", "content": f"classify {custom_id}"}]}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                       "body": body})  # fmt: skip


def make_batch(queue: Any, ids: list[str], now: int, window: str = "1h") -> dict[str, Any]:
    upload = queue.upload_path()
    upload.write_bytes(("\n".join(line(i) for i in ids) + "\n").encode())
    file = queue.add_file("c", "batch", "in.jsonl", upload, now)
    ask = {"input_file_id": file["id"], "endpoint": "/v1/chat/completions",
           "completion_window": window}  # fmt: skip
    return dict(queue.create("c", ask, now))


class SQLiteQueues:
    """Queues on one folder: `open()` is a process starting on it (again, after a crash)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def open(self) -> SQLiteBatchQueue:
        return SQLiteBatchQueue(self.folder, CAPS)

    @staticmethod
    def kept(queue: SQLiteBatchQueue) -> dict[str, dict[str, int]]:
        rows = queue._conn.execute(f"SELECT batch, {', '.join(COUNTS)} FROM batch_count")
        return {r[0]: dict(zip(COUNTS, r[1:], strict=True)) for r in rows}

    @staticmethod
    def recounted(queue: SQLiteBatchQueue) -> dict[str, dict[str, int]]:
        batches = queue._conn.execute("SELECT id FROM batch")
        found = {b: dict.fromkeys(COUNTS, 0) for (b,) in batches}
        for batch, state, outcome, n in queue._conn.execute(
            "SELECT batch, state, outcome, count(*) FROM batch_item GROUP BY 1, 2, 3"
        ):
            found.setdefault(batch, dict.fromkeys(COUNTS, 0))[
                outcome if state == "done" else state
            ] += n
        return found


@pytest.fixture(params=["sqlite"])
def queues(request: pytest.FixtureRequest) -> Iterator[Callable[[], Any]]:
    """Makes a new, empty queue store (one per Hypothesis example) and returns its opener."""
    with tempfile.TemporaryDirectory(prefix="lanes-queue-") as scratch:
        made = iter(range(10**6))

        def fresh() -> Any:
            return SQLiteQueues(Path(scratch) / str(next(made)))

        yield fresh


#: (operation, a number it reads as it needs): creates and takes drawn most, so that most
#: sequences have items running when a leader dies, a batch is cancelled or its window ends.
WEIGHTED = [*["create"] * 2, *["take"] * 3, *["finish"] * 2, "later", "cancel", "settle", "crash",
            "delete", "create_bad"]  # fmt: skip
OPS = st.lists(
    st.tuples(st.sampled_from(WEIGHTED), st.integers(0, 2400)),
    min_size=3,
    max_size=40,
)


class Run:
    """A sequence of operations on one queue store, as a leader and clients would make them."""

    def __init__(self, store: Any) -> None:
        self.store, self.queue = store, store.open()
        self.now, self.leader = 1000, 0
        self.made: list[str] = []
        self.running: list[Any] = []
        assert self.queue.lead(f"leader-{self.leader}", self.now, 15.0)

    def step(self, op: str, n: int) -> None:
        getattr(self, op)(n)

    def create(self, n: int) -> None:
        ids = [f"r{len(self.made)}-{i}" for i in range(1 + n % 4)]
        self.made.append(make_batch(self.queue, ids, self.now)["id"])

    def create_bad(self, _: int) -> None:  # a repeated custom_id: failed at once, nothing runs
        self.made.append(make_batch(self.queue, ["x", "x"], self.now)["id"])

    def take(self, n: int) -> None:
        self.running += self.queue.take(float(self.now), 1 + n % 4)

    def finish(self, ok: int) -> None:
        if self.running:
            self.queue.finish(self.running.pop(0), ok=bool(ok % 2), line=b'{"done": true}\n')

    def later(self, wait: int) -> None:
        if self.running:
            self.queue.later(self.running.pop(0), float(self.now + wait % 120))

    def cancel(self, which: int) -> None:
        if self.made:
            self.queue.cancel("c", self.made[which % len(self.made)], self.now)

    def settle(self, advance: int) -> None:
        self.now += advance if advance % 3 else 0  # a third now, the others later (expiries)
        self.queue.settle(float(self.now))

    def crash(self, _: int) -> None:
        """The leader dies with its items running; another process leads after its lease."""
        self.queue.close()
        self.queue, self.leader, self.now = self.store.open(), self.leader + 1, self.now + 16
        assert self.queue.lead(f"leader-{self.leader}", self.now, 15.0)
        self.running = []  # a late answer of the dead leader's would not be written anyway

    def delete(self, which: int) -> None:
        if self.made:
            self.queue.delete_batch("c", self.made[which % len(self.made)])


@settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=OPS)
def test_the_kept_counts_equal_a_full_recount_after_any_sequence(queues, ops):
    """After any sequence of creates, takes, answers, put-backs, cancels, window ends, a leader
    dying with items running and deletes, each batch's kept counts are its items recounted, and
    the queue's tally and a batch's `request_counts` agree with them."""
    store = queues()
    run = Run(store)
    try:
        for op, n in ops:
            run.step(op, n)
            assert store.kept(run.queue) == store.recounted(run.queue), (op, n)
        kept = store.kept(run.queue)
        items = run.queue.tally()["items"]
        assert items["pending"] == sum(c["pending"] for c in kept.values())
        assert items["running"] == sum(c["running"] for c in kept.values())
        assert items["completed"] == sum(c["ok"] for c in kept.values())
        for batch_id, counts in kept.items():
            data = run.queue.batch("c", batch_id)
            assert data is not None
            done = data["request_counts"]
            assert done["completed"] == counts["ok"]
            assert done["failed"] == counts["error"] + counts["expired"] + counts["cancelled"]
            assert run.queue.outcomes(batch_id) == {
                k: counts[k] for k in ("ok", "error", "expired", "cancelled")
            }
    finally:
        run.queue.close()


def test_a_queue_of_an_older_version_has_its_counts_recounted_once(tmp_path):
    """A queue file written before the counts were kept (no `batch_count` rows) is counted once
    when it is opened, and settles as before."""
    store = SQLiteQueues(tmp_path / "q")
    queue = store.open()
    made = make_batch(queue, ["x", "y", "z"], 1000)
    assert queue.lead("me", 1000.0, 15.0)
    first, *_ = queue.take(1000.0, 2)
    queue.finish(first, ok=True, line=b"{}\n")
    queue._conn.execute("DELETE FROM batch_count")  # as an older version left it
    queue.close()
    again = store.open()
    assert store.kept(again) == store.recounted(again)
    assert store.kept(again)[made["id"]] == dict.fromkeys(COUNTS, 0) | {
        "pending": 1, "running": 1, "ok": 1
    }  # fmt: skip
    again.close()

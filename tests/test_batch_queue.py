"""The batch queue's contract (`lanes/_core/batch/queue.py`), on both backends — a SQLite file and
folder (the processes of one host), and one real `redis-server` (several hosts): what a crash
leaves, what a window's end and a cancel answer, that nothing runs from a file with a bad line,
that an answer is written once, that a batch's budget holds, that what a client keeps is bounded
and its own, and that the kept counts (each batch's items by state, kept in the steps that change
them, so a round of the runner reads a batch's counts and not its items) always equal a full
recount of the items, whatever happened."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import pytest
from batch_backends import (
    BACKENDS,
    CAPS,
    COUNTS,
    SQLiteQueues,
    jsonl,
    line,
    make_batch,
    queue_stores,
    upload,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import examples
from lanes._core.batch.queue import BatchRefused, Caps


@pytest.fixture(params=BACKENDS)
def queues(request: pytest.FixtureRequest) -> Iterator[Callable[[], Any]]:
    """Makes a new, empty queue store of each backend (one per Hypothesis example)."""
    with queue_stores(request.param, request) as fresh:
        yield fresh


@pytest.fixture
def store(queues: Callable[[], Any]) -> Any:
    return queues()


@pytest.fixture
def queue(store: Any) -> Iterator[Any]:
    opened = store.open()
    yield opened
    opened.close()


#: (operation, a number it reads as it needs): creates and takes drawn most, so that most
#: sequences have items running when a leader dies, a batch is cancelled or its window ends.
WEIGHTED = [*["create"] * 2, *["take"] * 3, *["finish"] * 2, "later", "cancel", "settle", "crash",
            "delete", "create_bad", "late"]  # fmt: skip
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
        self.stale: list[tuple[Any, Any]] = []  # items a dead leader ran, and its queue
        self.opened = [self.queue]
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
        self.stale += [(self.queue, item) for item in self.running]
        self.queue, self.leader, self.now = self.store.open(), self.leader + 1, self.now + 16
        self.opened.append(self.queue)
        assert self.queue.lead(f"leader-{self.leader}", self.now, 15.0)
        self.running = []

    def late(self, ok: int) -> None:
        """A dead leader's late answer (or put-back) of an item taken back: not written."""
        if self.stale:
            queue, item = self.stale.pop(0)
            before = self.store.kept(self.queue)
            if ok % 3:
                queue.finish(item, ok=bool(ok % 2), line=b'{"late": true}\n')
            else:
                queue.later(item, float(self.now))
            assert self.store.kept(self.queue) == before

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
        statuses = Counter(run.queue.batch("c", b)["status"] for b in kept)
        assert run.queue.tally()["batches"] == dict(statuses)
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
        for opened in run.opened:
            opened.close()


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


def test_an_item_a_dead_leader_left_running_is_taken_again_and_answered_once(store):
    """A process takes two items and dies; another opens the queue and, once the lease has run
    out, leads and takes them back; one answer each, written with the mark that it is done — a
    late answer of the dead leader's, or a second one, is not written."""
    queue = store.open()
    made = make_batch(queue, ["x", "y"])
    assert queue.lead("old", 1000.0, 15.0)
    taken = queue.take(1000.0, 10)
    assert [(t.custom_id, t.tries) for t in taken] == [("x", 1), ("y", 1)]
    again = store.open()  # the old process dies with both running (its queue never closed)
    assert not again.lead("new", 1005.0, 15.0)  # the old lease still holds
    assert again.lead("new", 1016.0, 15.0)
    assert not queue.lead("old", 1017.0, 15.0)  # and the old one no longer leads
    retaken = again.take(1016.0, 10)
    assert [(t.custom_id, t.tries) for t in retaken] == [("x", 2), ("y", 2)]
    queue.finish(taken[0], ok=True, line=b'{"late": true}\n')  # too late: taken again
    for item in retaken:
        again.finish(item, ok=True, line=f'{{"custom_id": "{item.custom_id}"}}\n'.encode())
        again.finish(item, ok=True, line=b"twice\n")  # a second answer is not written
    assert again.settle(1017.0) == [made["id"]]
    batch = again.batch("c", made["id"])
    assert batch is not None and batch["status"] == "completed"
    assert batch["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
    content = again.content("c", batch["output_file_id"])
    assert content is not None
    assert b"".join(content) == b'{"custom_id": "x"}\n{"custom_id": "y"}\n'
    queue.close()
    again.close()


def test_a_window_that_ends_expires_what_is_left_and_a_cancel_cancels(queue):
    """Past its window, a batch's items left get `batch_expired` in the error file; a cancelled
    batch waits for its running item, then its items left get `batch_cancelled`."""
    assert queue.lead("me", 1000.0, 1e9)
    late = make_batch(queue, ["x", "y"], window="1h")
    assert queue.next_due(1000.0) == 1000.0
    assert queue.settle(1000.0 + 3599) == []
    assert queue.take(1000.0 + 3600, 5) == []  # its window ended: nothing of it is taken
    assert queue.settle(1000.0 + 3600) == [late["id"]]
    expired = queue.batch("c", late["id"])
    assert expired is not None and expired["status"] == "expired"
    assert expired["request_counts"]["failed"] == 2 and expired["expired_at"] == 4600
    assert queue.outcomes(late["id"]) == {"ok": 0, "error": 0, "expired": 2, "cancelled": 0}
    content = queue.content("c", expired["error_file_id"])
    assert content is not None and b"".join(content).count(b"batch_expired") == 2
    assert queue.next_due(5000.0) is None
    stopped = make_batch(queue, ["x", "y", "z"], now=5000)
    (running,) = queue.take(5000.0, 1)
    assert queue.cancel("other", stopped["id"], 5001) is None  # not its batch
    assert queue.cancel("c", stopped["id"], 5001)["status"] == "cancelling"
    assert queue.take(5001.0, 5) == [] and queue.settle(5001.0) == []
    queue.finish(running, ok=True, line=b'{"custom_id": "x"}\n')
    assert queue.settle(5002.0) == [stopped["id"]]
    cancelled = queue.batch("c", stopped["id"])
    assert cancelled is not None and cancelled["status"] == "cancelled"
    assert cancelled["request_counts"] == {"total": 3, "completed": 1, "failed": 2}
    assert queue.cancel("c", stopped["id"], 5003)["status"] == "cancelled"  # as it is
    assert queue.tally() == {
        "batches": {"expired": 1, "cancelled": 1},
        "items": {"pending": 0, "running": 0, "completed": 1, "failed": 4},
    }


def test_items_are_taken_by_window_then_put_back_until_their_time(queue):
    """`take` gives the items due, the soonest window's end first; an item put back is not taken
    before its time, and `next_due` says when; bodies are their lines, byte for byte."""
    assert queue.lead("me", 1000.0, 1e9)
    long = make_batch(queue, ["a", "b"], window="2h")
    short = make_batch(queue, ["c", "d"], window="1h")
    taken = queue.take(1000.0, 3)
    assert [(t.batch, t.custom_id) for t in taken] == [
        (short["id"], "c"), (short["id"], "d"), (long["id"], "a")]  # fmt: skip
    assert [queue.body(t) for t in taken] == [line(t.custom_id).encode() + b"\n" for t in taken]
    queue.later(taken[0], 1100.0)
    queue.later(taken[0], 1.0)  # not running any more: not put back twice
    assert queue.next_due(1000.0) == 1000.0  # "b" is due
    (b,) = queue.take(1000.0, 5)
    assert b.custom_id == "b" and queue.next_due(1000.0) == 1100.0
    assert queue.take(1099.0, 5) == []
    (again,) = queue.take(1100.0, 5)
    assert (again.custom_id, again.tries) == ("c", 2)
    (held,) = queue.open_batches("c", 10)[:1]
    assert held["id"] == short["id"] and held["next_try_at"] is None  # none of it waits
    assert [b["id"] for b in queue.open_batches(None, 10)] == [short["id"], long["id"]]
    assert queue.open_batches("someone", 10) == []


def test_a_file_with_bad_lines_fails_its_batch_listing_the_first_bad_lines(queue):
    """Every bad line is listed (1-based, with a code) up to 100, in line order — a repeated
    custom_id included, however far from the first — and nothing of the batch is kept to run."""
    lines = [line(f"r{i}") for i in range(700)]
    lines[2] = "{not json"
    lines[650] = line("r10")
    for i in range(550, 640):
        lines[i] = line(f"r{i}", url="/v1/embeddings")
    lines.insert(5, "   ")  # a blank line is no item (and keeps its number)
    file = upload(queue, jsonl(*lines))
    ask = {"input_file_id": file["id"], "endpoint": "/v1/chat/completions",
           "completion_window": "24h"}  # fmt: skip
    made = queue.create("c", ask, 1000)
    assert made["status"] == "failed" and made["failed_at"] == 1000
    found = [(e["line"], e["code"]) for e in made["errors"]["data"]]
    assert found[0] == (3, "invalid_json_line") and len(found) == 92
    assert found[1:91] == [(n + 2, "mismatched_url") for n in range(550, 640)]
    assert found[91] == (652, "duplicate_custom_id")
    assert queue.lead("me", 1000.0, 1e9) and queue.take(1000.0, 10) == []
    assert queue.tally()["items"]["pending"] == 0
    with pytest.raises(BatchRefused, match="completion_window"):
        queue.create("c", {**ask, "completion_window": "8d"}, 1000)
    with pytest.raises(BatchRefused) as unknown:
        queue.create("c", {**ask, "input_file_id": "file-nope"}, 1000)
    assert unknown.value.status == 404
    with pytest.raises(BatchRefused) as others:
        queue.create("someone", ask, 1000)  # another client's file
    assert others.value.status == 404


def test_files_are_a_clients_own_listed_read_and_deleted(store, queue):
    """A file is its client's: listed newest first (paged by `after`), read back as uploaded,
    deleted with its bytes; an output file's lines go when it is deleted."""
    raw = jsonl(*(line(f"r{i}") for i in range(30)))
    first = upload(queue, raw, now=1000)
    second = upload(queue, jsonl(line("x")), now=1001)
    assert first["bytes"] == len(raw) and first["purpose"] == "batch"
    assert [f["id"] for f in queue.files("c", 10, None)] == [second["id"], first["id"]]
    assert [f["id"] for f in queue.files("c", 10, second["id"])] == [first["id"]]
    assert queue.files("someone", 10, None) == [] and queue.file("someone", first["id"]) is None
    assert b"".join(queue.content("c", first["id"])) == raw
    assert queue.content("someone", first["id"]) is None
    assert not queue.delete_file("someone", first["id"])
    assert queue.delete_file("c", second["id"]) and queue.file("c", second["id"]) is None
    assert not queue.delete_file("c", second["id"])
    assert store.bodies() == 1
    made = queue.create("c", {"input_file_id": first["id"], "endpoint": "/v1/chat/completions",
                              "completion_window": "1h"}, 1000)  # fmt: skip
    assert queue.delete_file("c", first["id"])  # deleted while its batch runs: its bytes stay
    assert queue.lead("me", 1000.0, 1e9)
    items = queue.take(1000.0, 30)
    assert queue.body(items[-1]) == line("r29").encode() + b"\n"
    for item in items:
        queue.finish(item, ok=item.line % 3 != 0, line=f"{item.custom_id}\n".encode())
    assert queue.settle(1001.0) == [made["id"]] and store.bodies() == 0  # ended: bytes gone
    done = queue.batch("c", made["id"])
    output, errors = done["output_file_id"], done["error_file_id"]
    assert queue.file("c", output)["bytes"] == sum(len(f"r{i}\n") for i in range(30) if i % 3 != 2)
    lines = b"".join(queue.content("c", errors)).decode().split()
    assert lines == [f"r{i}" for i in range(2, 30, 3)]
    assert queue.delete_file("c", output) and queue.content("c", output) is None
    assert b"".join(queue.results("c", made["id"])).decode().split() == lines
    assert queue.results("someone", made["id"]) is None


def test_a_file_over_the_line_cap_is_refused_and_not_kept(store):
    queue = store.open(Caps(max_bytes=10_000, max_lines=2, max_line_bytes=1000))
    path = queue.upload_path()
    path.write_bytes(jsonl(line("a"), line("b"), line("c")))
    with pytest.raises(BatchRefused, match="max_lines"):
        queue.add_file("c", "batch", "in.jsonl", path, 0)
    with pytest.raises(BatchRefused, match="no line"):
        upload(queue, b"\n\n")
    with pytest.raises(BatchRefused, match="purpose"):
        upload(queue, jsonl(line("a")), purpose="fine-tune")
    long = upload(queue, jsonl(line("a" * 2000), line("b")))  # kept: its batch says why not
    ask = {"input_file_id": long["id"], "endpoint": "/v1/chat/completions",
           "completion_window": "1h"}  # fmt: skip
    made = queue.create("c", ask, 1000)
    assert [(e["line"], e["code"]) for e in made["errors"]["data"]] == [(1, "request_too_large")]
    assert not path.exists() and store.bodies() == 1
    queue.close()


def test_a_clients_files_and_open_batches_are_capped(store):
    """What one client keeps is bounded: files (delete one to upload another) and batches not
    ended yet; another client is not held back by it."""
    queue = store.open(attrs.evolve(CAPS, max_files=2, max_open=1))
    make_batch(queue, ["a"])
    with pytest.raises(BatchRefused, match="batches not ended") as refused:
        make_batch(queue, ["a"])  # its second file is kept; its second batch is not
    assert refused.value.status == 400  # not 429: waiting does not lift it (a client retries 429)
    with pytest.raises(BatchRefused, match="keeps 2 files"):
        upload(queue, jsonl(line("a")))
    assert upload(queue, jsonl(line("a")), client="other")["purpose"] == "batch"
    queue.close()


def test_the_bytes_a_client_keeps_are_capped(store):
    """Hostile review: with a Redis queue a client could keep `max_files` files of `max_file_mb`
    each (20 GB by default) in the Redis that holds the ledger. Its listed files' bytes together
    are capped (`batch.max_client_mb`); deleting one makes room; another client is not held back
    and a refused upload leaves nothing kept."""
    raw = jsonl(line("a"), line("b"))
    queue = store.open(attrs.evolve(CAPS, max_client_bytes=2 * len(raw) + 10))
    kept = [upload(queue, raw), upload(queue, raw)]
    with pytest.raises(BatchRefused, match="batch.max_client_mb") as refused:
        upload(queue, raw)
    assert refused.value.status == 400 and refused.value.param == "file"
    assert len(queue.files("c", limit=100, after=None)) == 2
    assert upload(queue, raw, client="other")["bytes"] == len(raw)
    assert queue.delete_file("c", kept[0]["id"])
    assert upload(queue, raw)["bytes"] == len(raw)
    queue.close()


def test_batches_are_listed_newest_first_by_endpoint_and_deleted_once_ended(store, queue):
    """A client's batches, newest first, paged by `after`, on the endpoints asked; an ended
    batch is deleted with its files (`purge` after the retention), one not ended is not."""
    made = [make_batch(queue, [f"x{i}"], now=1000 + i)["id"] for i in range(3)]
    assert [b["id"] for b in queue.batches("c", 10, None)] == made[::-1]
    assert [b["id"] for b in queue.batches("c", 1, made[2])] == [made[1]]
    assert queue.batches("c", 10, None, ("/v1/messages",)) == []
    assert queue.batches("someone", 10, None) == [] and queue.batch("someone", made[0]) is None
    assert queue.delete_batch("c", made[0]) is False  # not ended
    assert queue.delete_batch("someone", made[0]) is None
    for batch_id in made:
        queue.cancel("c", batch_id, 2000)
    assert queue.purge(2000.0) == 0  # ended at 2000: not before
    assert queue.delete_batch("c", made[0]) is True and queue.batch("c", made[0]) is None
    assert queue.purge(2001.0) == 2 and queue.batches("c", 10, None) == []
    assert store.bodies() == 0 and queue.files("c", 10, None) == []
    assert queue.tally() == {"batches": {}, "items": dict.fromkeys(
        ("pending", "running", "completed", "failed"), 0)}  # fmt: skip


def test_a_paid_try_a_dead_leader_held_counts_spent_and_the_budget_holds(store):
    """A batch's budget: one try holds what is left (a second can not hold meanwhile), settles to
    what it cost (a cost not known: all it held); a try held by a process that died counts spent
    in full when the next leader takes the queue."""
    queue = store.open()
    made = make_batch(queue, ["x"], budget="0.5")
    with pytest.raises(BatchRefused):
        make_batch(queue, ["x"], budget="-1")
    assert queue.lead("old", 1000.0, 15.0)
    [item] = queue.take(1000.0, 1)
    assert queue.paid_room(made["id"]) == 0.5
    assert not queue.hold_paid(item, 0.6) and not queue.hold_paid(item, 0.0)
    assert queue.hold_paid(item, 0.5) and queue.paid_room(made["id"]) == 0.0
    assert not queue.hold_paid(item, 0.1)  # one try at a time
    assert queue.settle_paid(made["id"], 0.2) == 0.2
    assert queue.paid_room(made["id"]) == 0.5 - 0.2  # the same double on both backends
    assert queue.hold_paid(item, 0.5 - 0.2)
    assert queue.settle_paid(made["id"], float("nan")) == 0.5 - 0.2  # not known: all it held
    assert queue.paid_room(made["id"]) == 0.0
    queue.close()
    again = store.open()
    batch = again.batch("c", made["id"])
    assert batch is not None and batch["lanes"] == {
        "max_paid_usd": 0.5, "paid_usd": 0.2 + (0.5 - 0.2), "paid_held_usd": 0.0}  # fmt: skip
    second = make_batch(again, ["y"], budget="0.5")
    assert again.lead("old", 1001.0, 15.0)
    [held] = [i for i in again.take(1001.0, 5) if i.batch == second["id"]]
    assert again.hold_paid(held, 0.4)
    assert again.batch("c", second["id"])["lanes"]["paid_held_usd"] == 0.4
    again.close()  # its process dies mid-try
    third = store.open()
    assert third.lead("new", 1100.0, 15.0)  # the old lease ran out: the held try is spent
    batch = third.batch("c", second["id"])
    assert batch is not None and batch["lanes"]["paid_usd"] == 0.4
    assert batch["lanes"]["paid_held_usd"] == 0.0 and third.paid_room(second["id"]) == 0.5 - 0.4
    assert third.settle_paid(second["id"], 0.3) == 0.3  # its late settlement counts too: never less
    assert third.batch("c", second["id"])["lanes"]["paid_usd"] == 0.4 + 0.3
    plain = make_batch(third, ["z"])
    assert "lanes" not in third.batch("c", plain["id"]) and third.paid_room(plain["id"]) == 0.0
    assert not third.hold_paid(next(i for i in third.take(1100.0, 5) if i.custom_id == "z"), 0.01)
    third.close()


def test_a_batch_no_longer_running_has_nothing_to_pay(queue):
    made = make_batch(queue, ["x"], budget="0.5")
    assert queue.lead("me", 1000.0, 15.0)
    [item] = queue.take(1000.0, 1)
    assert queue.paid_room(made["id"]) == 0.5
    assert queue.cancel("c", made["id"], 1001) is not None
    assert queue.paid_room(made["id"]) == 0.0 and not queue.hold_paid(item, 0.1)


def test_an_input_file_two_batches_run_from_stays_until_both_have_ended(store, queue):
    """Two batches from one file: the first deleted, or the file deleted, while the second runs,
    its bytes stay until the second ends (review: the first's delete took them)."""
    file = upload(queue, jsonl(line("a"), line("b")))
    ask = {"input_file_id": file["id"], "endpoint": "/v1/chat/completions",
           "completion_window": "1h"}  # fmt: skip
    first, second = queue.create("c", ask, 1000), queue.create("c", ask, 1000)
    queue.cancel("c", first["id"], 1001)
    assert queue.delete_batch("c", first["id"]) is True
    assert queue.lead("me", 1001.0, 1e9)
    items = queue.take(1001.0, 5)
    assert [queue.body(i) for i in items] == [
        line("a").encode() + b"\n",
        line("b").encode() + b"\n",
    ]
    assert store.bodies() == 1
    for item in items:
        queue.finish(item, ok=True, line=b"{}\n")
    assert queue.settle(1002.0) == [second["id"]] and store.bodies() == 0


def test_a_batch_without_a_budget_of_its_own_has_its_clients(queue):
    """A client's `batch_max_paid_usd` is the budget of a batch whose metadata names none; one
    the metadata names, 0 included, is the batch's own."""
    from batch_backends import jsonl, line, upload

    def created(metadata: dict[str, str] | None) -> dict[str, Any]:
        file = upload(queue, jsonl(line("a")))
        ask = {"input_file_id": file["id"], "endpoint": "/v1/chat/completions",
               "completion_window": "1h", "metadata": metadata}  # fmt: skip
        return dict(queue.create("c", ask, 1000, default_budget=0.25))

    assert created(None)["lanes"]["max_paid_usd"] == 0.25
    assert created({"team": "x"})["lanes"]["max_paid_usd"] == 0.25
    assert created({"lanes_max_paid_usd": "0.1"})["lanes"]["max_paid_usd"] == 0.1
    assert "max_paid_usd" not in created({"lanes_max_paid_usd": "0"}).get("lanes", {})
    plain = {"input_file_id": upload(queue, jsonl(line("a")))["id"],
             "endpoint": "/v1/chat/completions", "completion_window": "1h"}  # fmt: skip
    assert "max_paid_usd" not in dict(queue.create("c", plain, 1000)).get("lanes", {})


def test_a_held_batch_is_not_taken_before_its_time(queue):
    """`hold`: none of a batch's items is taken before its time, which the next due and the
    batch's `next_try_at` say; then they are."""
    made = make_batch(queue, ["a", "b"], now=1000)
    queue.hold(made["id"], 1030.0)
    assert queue.take(1001, 4) == []
    assert queue.next_due(1001) == 1030.0
    [listed] = queue.open_batches("c", 10)
    assert listed["next_try_at"] == 1030.0
    taken = queue.take(1030.5, 4)
    assert sorted(i.custom_id for i in taken) == ["a", "b"]
    assert {i.model for i in taken} == {json.loads(line("a"))["body"]["model"]}  # its one model


def test_a_run_whose_item_was_taken_back_can_not_hold_the_budget(store):
    """Hostile review: a leader that lost the queue while an item ran could still hold its
    batch's budget for that item's paid try after the new leader had paid for it — one item
    billed twice. A hold is the run's that has the item (its tries), as its answer is."""
    old = store.open()
    made = make_batch(old, ["x"], budget="0.5")
    assert old.lead("old", 1000.0, 15.0)
    [stale] = old.take(1000.0, 1)
    new = store.open()
    assert new.lead("new", 1100.0, 15.0)  # the old lease ran out: its item is taken back
    [item] = new.take(1100.0, 1)
    assert new.hold_paid(item, 0.5) and new.settle_paid(made["id"], 0.1) == 0.1
    assert not old.hold_paid(stale, 0.4)  # the stale run's paid try: refused
    assert new.paid_room(made["id"]) == 0.4
    old.close()
    new.close()


def test_blank_lines_count_toward_the_line_cap(store, queue):
    """Hostile review: blank lines were not counted toward `max_lines`, so an upload of 200 MB
    of newlines was read a line at a time — two minutes on upload, as long again inside the
    create's transaction — while every other call on the queue waited."""
    with pytest.raises(BatchRefused, match="max_lines"):
        upload(queue, b"\n" * (CAPS.max_lines + 1) + jsonl(line("a")))
    assert queue.files("c", 10, None) == [] and store.bodies() == 0
    full = jsonl(*(line(str(n)) for n in range(CAPS.max_lines))) + b"\n"  # a trailing blank
    assert upload(queue, full)["bytes"] == len(full)


def test_the_leader_takes_back_what_it_holds_running_and_does_not_run(queue):
    """Hostile review: an item whose answer and put-back the store lost (down, or rolled back)
    stayed running under the same leader for good, and its batch never ended. The leader says
    what it runs; the rest it holds running is taken back (unsaid: none is)."""
    made = make_batch(queue, ["a", "b"])
    assert queue.lead("me", 1000.0, 15.0)
    one, two = queue.take(1000.0, 2)
    assert queue.lead("me", 1001.0, 15.0)  # not said: nothing taken back
    assert queue.lead("me", 1002.0, 15.0, running=[(one.batch, one.line)])
    [again] = queue.take(1002.0, 2)  # `two`, lost: taken again; `one` still runs
    assert (again.custom_id, again.tries) == (two.custom_id, 2)
    queue.finish(two, ok=True, line=b"late\n")  # the lost run's answer: not written
    queue.finish(one, ok=True, line=b"{}\n")
    queue.finish(again, ok=True, line=b"{}\n")
    assert queue.settle(1003.0) == [made["id"]]
    assert b"late" not in b"".join(queue.results("c", made["id"]) or [])


def test_a_message_batchs_requests_do_not_count_toward_the_clients_files(store):
    """Hostile review: a Message Batch's requests, kept as an input file until its batch is
    deleted or purged, counted toward the client's `max_files`: after 100 Message Batches in a
    week every upload was refused, "delete one first", of files `/v1/files` does not list."""
    queue = store.open(attrs.evolve(CAPS, max_files=2))
    for _ in range(3):  # kept with their batches (at most `max_open` running)
        upload(queue, jsonl(line("a")), purpose="message_batch", purposes=("message_batch",))
    upload(queue, jsonl(line("a")))
    upload(queue, jsonl(line("b")))
    with pytest.raises(BatchRefused, match="files already"):
        upload(queue, jsonl(line("c")))
    queue.close()

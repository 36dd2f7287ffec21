"""The two backends the batch queue's contract runs on (tests/test_batch_queue.py,
tests/test_batch_hosts.py): a SQLite file and folder (several processes of one host), or one real
`redis-server` (several hosts). A store is one queue's storage; `open()` is a process or host
starting on it (again, after a crash); `kept` and `recounted` read a batch's counts as the queue
keeps them and as a full recount of its items finds them."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from lanes._core.batch.queue import Caps
from lanes._core.batch.sqlite_queue import SQLiteBatchQueue

BACKENDS = ("sqlite", "redis")
CAPS = Caps(max_bytes=1_000_000, max_lines=2000, max_line_bytes=10_000, max_files=1000,
            max_open=1000)  # fmt: skip
COUNTS = ("pending", "running", "ok", "error", "expired", "cancelled")
LETTERS = {"o": "ok", "e": "error", "x": "expired", "c": "cancelled"}


def line(custom_id: str, url: str = "/v1/chat/completions") -> str:
    body = {"model": "m", "messages": [{"role": "user", "content": f"classify {custom_id}"}]}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def jsonl(*lines: str) -> bytes:
    return ("\n".join(lines) + "\n").encode()


def upload(queue: Any, raw: bytes, client: str = "c", now: int = 1000, **kw: Any) -> Any:
    path = queue.upload_path()
    path.write_bytes(raw)
    return queue.add_file(client, kw.pop("purpose", "batch"), "in.jsonl", path, now, **kw)


def make_batch(
    queue: Any, ids: list[str], now: int = 1000, window: str = "1h", budget: str = "",
    client: str = "c",
) -> dict[str, Any]:  # fmt: skip
    file = upload(queue, jsonl(*(line(i) for i in ids)), client, now)
    ask = {"input_file_id": file["id"], "endpoint": "/v1/chat/completions",
           "completion_window": window,
           "metadata": {"lanes_max_paid_usd": budget} if budget else None}  # fmt: skip
    return dict(queue.create(client, ask, now))


class SQLiteQueues:
    """Queues on one folder."""

    kind = "sqlite"

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def open(self, caps: Caps = CAPS) -> SQLiteBatchQueue:
        return SQLiteBatchQueue(self.folder, caps)

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

    def bodies(self) -> int:
        """How many files' bytes are stored."""
        return len(list((self.folder / "files").glob("*.jsonl")))


class RedisQueues:
    """Queues on one Redis (emptied when the store is made), in `namespace`."""

    kind = "redis"

    def __init__(self, url: str, scratch: Path, namespace: str = "") -> None:
        import redis

        self.url, self.scratch, self.namespace = url, scratch, namespace
        self.redis = redis.Redis.from_url(url, decode_responses=True)
        self.prefix = f"lanes:{{{namespace}}}:bq:" if namespace else "lanes:bq:"

    def open(self, caps: Caps = CAPS) -> Any:
        from lanes._core.batch.redis_queue import RedisBatchQueue

        # small chunks: an item's line spans several of them
        return RedisBatchQueue(self.url, caps, self.scratch, namespace=self.namespace,
                               chunk_bytes=97)  # fmt: skip

    def _batches(self) -> list[str]:
        found = self.redis.scan_iter(f"{self.prefix}batch:*")
        return [k.removeprefix(f"{self.prefix}batch:") for k in found]

    def kept(self, queue: Any) -> dict[str, dict[str, int]]:
        return {
            b: {k: int(v or 0) for k, v in zip(COUNTS, self.redis.hmget(f"{self.prefix}batch:{b}",
                                                                         COUNTS), strict=True)}
            for b in self._batches()
        }  # fmt: skip

    def recounted(self, queue: Any) -> dict[str, dict[str, int]]:
        found = {}
        for b in self._batches():
            counts = dict.fromkeys(COUNTS, 0)
            counts["pending"] = self.redis.zcard(f"{self.prefix}pending:{b}")
            counts["running"] = self.redis.scard(f"{self.prefix}running:{b}")
            for value in self.redis.hvals(f"{self.prefix}done:{b}"):
                counts[LETTERS[str(value)[0]]] += 1
            found[b] = counts
        return found

    def bodies(self) -> int:
        """How many files' bytes are stored (their first chunks)."""
        return sum(1 for _ in self.redis.scan_iter(f"{self.prefix}chunk:*:0"))


@contextmanager
def queue_stores(kind: str, request: pytest.FixtureRequest) -> Iterator[Callable[[], Any]]:
    """A maker of new, empty stores of `kind` (each Hypothesis example takes a new one)."""
    folder = Path(request.getfixturevalue("tmp_path"))
    made = itertools.count()
    if kind == "sqlite":
        yield lambda: SQLiteQueues(folder / f"q{next(made)}")
        return
    server = request.getfixturevalue("redis_server")

    def fresh() -> RedisQueues:
        store = RedisQueues(server.url, folder / "scratch")
        store.redis.flushall()
        return store

    yield fresh

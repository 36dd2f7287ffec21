"""The Redis batch queue: files, batches and items in the deployment's Redis state store, so every
host shares one queue (the contract is `queue.py`'s; the keys and the scripts are `redis_lua.py`'s).

Request bodies are stored in Redis here: an upload's bytes in chunks, kept until the file is
deleted or its batch's retention ends. Every step that changes an item is one Lua script: an
item's answer is written in the step that marks it done, and only while it is running, so a late
answer of a leader that lost the queue is not written and no item is answered twice; one leader
at a time holds the queue's lease (`lead`: a hash on the hosts' walls, renewed every round, with
no expiry that an eviction policy could take), and a new one takes back what the last one left
running and counts a paid try it held as spent in full. Each batch's items are counted in the
same scripts, so a round reads a batch's counts, never its items. Every key carries the
deployment's namespace (`state_namespace`). Blocking (redis-py's client): call it from a worker
thread.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import redis

from lanes._core.batch import budget
from lanes._core.batch.lines import ENDPOINTS, MAX_ERRORS, Line, LineError, closed_line
from lanes._core.batch.queue import (
    COUNTS,
    Caps,
    Item,
    Obj,
    asked,
    check_input,
    check_open,
    created,
    duplicate,
    ending_of,
    lines_in,
    new_batch,
    new_id,
)
from lanes._core.batch.redis_files import PAGE, RedisBatchFiles, member
from lanes._core.batch.redis_lua import (
    CANCEL,
    CLOSE,
    CREATE,
    DELETE_BATCH,
    END,
    FINISH,
    HOLD,
    HOLD_BATCH,
    HOLD_BATCH_MODEL,
    LATER,
    LEAD,
    NEXT_DUE,
    SETTLE_PAID,
    STAGE,
    TAKE,
)
from lanes._core.state.redis_store import connection_pool, memory_policy, redacted

log = logging.getLogger("lanes")
CHUNK_BYTES = 1 << 20  # an input file's bytes per Redis key
STAGED_S = 86400  # the expiry of a batch's items while they are written (then none)
#: What a batch's record keeps beside the object it was created as.
CHANGED = ("status", "in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at",
           "cancelling_at", "cancelled_at", "output_file_id", "error_file_id")  # fmt: skip


class RedisBatchQueue(RedisBatchFiles):
    """The queue in the Redis at `url` (as `state`: `redis://`, `rediss://`, `unix://`,
    `redis+sentinel://`), under `namespace`; uploads in progress in `scratch`."""

    def __init__(
        self,
        url: str,
        caps: Caps,
        scratch: Path,
        *,
        namespace: str = "",
        chunk_bytes: int = CHUNK_BYTES,
        timeout_s: float = 5.0,
    ) -> None:
        self.caps, self.where = caps, redacted(url)
        self._scratch, self._chunk, self._scripts = scratch, chunk_bytes, {}
        scratch.mkdir(parents=True, exist_ok=True)
        waits = {"socket_connect_timeout": timeout_s, "socket_timeout": timeout_s}
        pool = connection_pool(url, max_connections=8, timeout=timeout_s, **waits)
        self._r = redis.Redis(connection_pool=pool)
        self._p = f"lanes:{{{namespace}}}:bq:" if namespace else "lanes:bq:"

    def close(self) -> None:
        self._r.close()
        self._r.connection_pool.disconnect()

    def evicting(self) -> str:
        """Why the server may evict the queue's keys ("" when it does not say so, or can not be
        reached now): its `maxmemory-policy` is `allkeys-*` (the keys carry no expiry, so
        `volatile-*` never takes one)."""
        try:
            policy = memory_policy(self._r)
        except (redis.RedisError, OSError):
            return ""
        if not policy.startswith("allkeys-"):
            return ""
        return (f"batch queue: redis at {self.where}: maxmemory-policy is {policy}, so Redis may "
                "evict batches, their items and their answers when memory is full; set it to "
                "noeviction or a volatile-* policy")  # fmt: skip

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
        BatchRefused as `SQLiteBatchQueue.create` does."""
        checked = asked(ask, endpoints, default_budget)
        check_input(self.file(client, checked.input_id), checked.input_id, purpose)
        check_open(self._r.scard(self._k("open", client)), self.caps)
        batch_id = new_id(prefix)
        data = new_batch(batch_id, checked, ask["completion_window"], now)
        errors, total, last, models = self._stage(batch_id, checked.input_id, checked.endpoint)
        created(data, errors, total, now)
        made = self._run(CREATE, batch_id, client, now, now + checked.window_s, data["status"],
                         json.dumps(data), checked.endpoint, checked.input_id, total, last,
                         repr(checked.paid_usd) if checked.paid_usd else "", now)  # fmt: skip
        if not made:
            self._unstage(batch_id)
            raise RuntimeError(f"batch {batch_id}: its items were evicted while they were written")
        if len(models) == 1 and not errors:  # one model: its items are held back together
            self._run(HOLD_BATCH_MODEL, batch_id, *models)
        return data

    def _stage(
        self, batch: str, file_id: str, endpoint: str
    ) -> tuple[list[LineError], int, int, set[str]]:
        """Every line of the file written as an item of `batch` (keys with an expiry until the
        batch is created), and (the bad lines instead, and none kept; how many; the last line's
        number). A repeated `custom_id` is found by the first to set it (`ids:<batch>`)."""
        errors: list[LineError] = []
        total = last = sent = 0
        staged: list[tuple[int, str, str]] = []
        models: set[str] = set()
        with self._reader(file_id) as stream:
            for number, begin, size, line in lines_in(stream, endpoint, self.caps.max_line_bytes):
                last = number
                if isinstance(line, Line):
                    if len(models) < 2:
                        models.add(line.body["model"])
                    item = json.dumps([begin, size, line.custom_id])
                    staged.append((number, line.custom_id, item))
                else:
                    errors.append(line)
                if number - sent >= PAGE:  # a page of lines: sent, and the first bad ones kept
                    total, sent = total + self._written(batch, staged, errors), number
            total += self._written(batch, staged, errors)
        if errors:
            self._unstage(batch)
        return errors, 0 if errors else total, last, models

    def _written(
        self, batch: str, staged: list[tuple[int, str, str]], errors: list[LineError]
    ) -> int:
        """Write the `staged` items (line, custom_id, item) in one step; a repeated custom_id is
        a bad line. How many were written."""
        if not staged:
            return 0
        args = [a for number, custom_id, item in staged for a in (member(number), custom_id, item)]
        for repeated in self._run(STAGE, batch, STAGED_S, *args):
            number = int(repeated)
            errors.append(duplicate(number, next(c for n, c, _ in staged if n == number)))
        errors.sort(key=lambda e: e.line)
        del errors[MAX_ERRORS:]
        done = len(staged)
        staged.clear()
        return done

    def _unstage(self, batch: str) -> None:
        self._r.unlink(*(self._k(key, batch) for key in ("ids", "items", "pending")))

    def _object(self, row: Mapping[bytes, bytes]) -> Obj:
        """A batch's object from its record: as created, with what changed since and its
        counts."""
        data: Obj = json.loads(row[b"data"])
        for name in CHANGED:
            value = row.get(name.encode())
            if value is not None:
                text = value.decode()
                data[name] = int(text) if name.endswith("_at") else text
        counts = {k: int(row.get(k.encode(), 0)) for k in COUNTS}
        failed = counts["error"] + counts["expired"] + counts["cancelled"]
        data["request_counts"] |= {"completed": counts["ok"], "failed": failed}
        if b"max_paid" in row:
            paid = {"max_paid_usd": float(row[b"max_paid"]), "paid_usd": float(row[b"paid"]),
                    "paid_held_usd": float(row[b"held"])}  # fmt: skip
            data["lanes"] = {**data.get("lanes", {}), **paid}
        return data

    def batch(self, client: str, batch_id: str) -> Obj | None:
        row = self._r.hgetall(self._k("batch", batch_id))
        if not row or row.get(b"client", b"").decode() != client:
            return None
        return self._object(row)

    def batches(
        self, client: str, limit: int, after: str | None, endpoints: tuple[str, ...] = ENDPOINTS
    ) -> list[Obj]:
        """This client's batches on `endpoints`, newest first, after the id `after`."""
        key, start, found = self._k("batches", client), 0, list[Obj]()
        if after is not None:
            rank = self._r.zrevrank(key, after)
            if rank is None:
                return []
            start = rank + 1
        while len(found) < limit:
            ids = self._r.zrevrange(key, start, start + limit - 1)
            if not ids:
                break
            start += len(ids)
            pipe = self._r.pipeline(transaction=False)
            for one in ids:
                pipe.hgetall(self._k("batch", one.decode()))
            rows = [r for r in pipe.execute() if r and r[b"endpoint"].decode() in endpoints]
            found += [self._object(r) for r in rows]
        return found[:limit]

    def open_batches(self, client: str | None, limit: int) -> list[Obj]:
        """The batches not ended of `client` (None: of every client), the soonest window's end
        first, at most `limit` — each with `next_try_at`: when its next item may run (None:
        none waits)."""
        pipe = self._r.pipeline(transaction=False)
        for one in self._r.zrange(self._k("open"), 0, -1):
            pipe.hgetall(self._k("batch", one.decode()))
            pipe.zrange(self._k("pending", one.decode()), 0, 0, withscores=True)
        replies, found = pipe.execute(), []
        for row, first in zip(replies[::2], replies[1::2], strict=True):
            if row and (client is None or row[b"client"].decode() == client):
                due = first[0][1] if first else None
                held = float(row.get(b"held_until") or 0.0)
                found.append(
                    self._object(row) | {"next_try_at": None if due is None else max(due, held)}
                )
        return found[:limit]

    def outcomes(self, batch_id: str) -> dict[str, int]:
        """How a batch's items ended so far: ok, error, expired, cancelled."""
        names = ("ok", "error", "expired", "cancelled")
        row = self._r.hmget(self._k("batch", batch_id), names)
        return {k: int(v or 0) for k, v in zip(names, row, strict=True)}

    def results(self, client: str, batch_id: str) -> Iterator[bytes] | None:
        """Every answered item's line, in line order; None when the batch is not this
        client's."""
        return None if self.batch(client, batch_id) is None else self._lines_of(batch_id, ok=None)

    def purge(self, ended_before: float) -> int:
        """Delete the batches that ended before `ended_before` with their items, their output and
        error files and their input file. How many were deleted."""
        ids = self._r.zrangebyscore(self._k("ended"), "-inf", f"({ended_before!r}", 0, 1000)
        gone = 0
        for one in (i.decode() for i in ids):
            client = self._r.hget(self._k("batch", one), "client")
            gone += bool(client is not None and self.delete_batch(client.decode(), one))
        return gone

    def delete_batch(self, client: str, batch_id: str) -> bool | None:
        """Delete an ended batch of this client's, its items and files: True; False when it has
        not ended; None when it is not this client's."""
        source = self._r.hget(self._k("batch", batch_id), "input_file_id")
        shared = source is not None and self._in_use(source.decode())
        done = self._run(DELETE_BATCH, batch_id, client, self._chunk, int(shared))
        return None if done == -1 else bool(done)

    def cancel(self, client: str, batch_id: str, now: int) -> Obj | None:
        """`cancelling`: no item is taken any more; `cancelled` once none is running. A batch
        already ended is returned as it is."""
        if self._run(CANCEL, batch_id, client, now) == -1:
            return None
        self.settle(now)
        return self.batch(client, batch_id)

    # -- the runner's side ----------------------------------------------------------------------
    def lead(
        self, owner: str, now: float, ttl_s: float, gone: Callable[[str], bool] = lambda _: False
    ) -> bool:
        """Take or keep the queue's one lease for every host (see `SQLiteBatchQueue.lead`)."""
        holder = self._r.hget(self._k("lead"), "owner")
        dead = holder.decode() if holder is not None and gone(holder.decode()) else ""
        return bool(self._run(LEAD, owner, repr(float(now)), repr(float(ttl_s)), dead))

    def paid_room(self, batch: str) -> float:
        """What is left of the batch's own paid budget (see `budget.py`)."""
        row = self._r.hmget(self._k("batch", batch), "status", "max_paid", "paid", "held")
        status = row[0].decode() if row[0] is not None else None
        return budget.room_of(status, *(float(v or 0) for v in row[1:]))

    def hold_paid(self, batch: str, amount: float) -> bool:
        return bool(self._run(HOLD, batch, repr(float(amount))))

    def settle_paid(self, batch: str, cost: float) -> float:
        told = repr(max(cost, 0.0)) if math.isfinite(cost) else ""
        return float(self._run(SETTLE_PAID, batch, told))

    def take(self, now: float, limit: int) -> list[Item]:
        """Up to `limit` items due now, of running batches, the earliest window end first."""
        taken = self._run(TAKE, repr(float(now)), limit)
        items = []
        for batch, line, item, endpoint, client, source, expires_at, tries, model in taken:
            start, length, custom_id = json.loads(item)
            items.append(Item(batch.decode(), int(line), custom_id, endpoint.decode(),
                              client.decode(), start, length, int(expires_at), source.decode(),
                              int(tries), model.decode() or None))  # fmt: skip
        return items

    def finish(self, item: Item, *, ok: bool, line: bytes) -> None:
        """The item's answer, written in the step that marks it done, and only by the run that
        has it (not a late answer of a run whose item was taken back); its counts follow."""
        self._run(FINISH, item.batch, member(item.line), item.tries, "ok" if ok else "error", line)

    def later(self, item: Item, not_before: float) -> None:
        """Put an item back, not to be taken before `not_before` (its free capacity resets)."""
        self._run(LATER, item.batch, member(item.line), item.tries, repr(float(not_before)))

    def tally(self) -> dict[str, dict[str, int]]:
        """Batches by status and items by state (as `ending.tally`)."""
        row = {k.decode(): int(v) for k, v in self._r.hgetall(self._k("tally")).items()}
        batches = {k[7:]: v for k, v in row.items() if k.startswith("status:") and v}
        failed = row.get("error", 0) + row.get("expired", 0) + row.get("cancelled", 0)
        items = {"pending": row.get("pending", 0), "running": row.get("running", 0),
                 "completed": row.get("ok", 0), "failed": failed}  # fmt: skip
        return {"batches": batches, "items": items}

    def hold(self, batch: str, until: float) -> None:
        """None of `batch`'s items is taken before `until` (its items, of one model, were told
        to wait for a quota's reset)."""
        self._run(HOLD_BATCH, batch, repr(float(until)))

    def next_due(self, now: float) -> float | None:
        """When the next pending item may be taken (None: none is pending)."""
        due = self._run(NEXT_DUE, repr(float(now)))
        return None if due is None else float(due)

    def settle(self, now: float) -> list[str]:
        """End what is over (see `SQLiteBatchQueue.settle`), from each running batch's counts.
        The ids ended."""
        ids = [i.decode() for i in self._r.zrange(self._k("open"), 0, -1)]
        pipe = self._r.pipeline(transaction=False)
        for one in ids:
            pipe.hmget(self._k("batch", one), "status", "expires_at", "endpoint", *COUNTS)
        ended = []
        for one, row in zip(ids, pipe.execute(), strict=True):
            if row[0] is None:
                continue
            counts = {k: int(v or 0) for k, v in zip(COUNTS, row[3:], strict=True)}
            status, close_as = ending_of(row[0].decode(), int(row[1]), counts, now)
            if status is None:
                continue
            if close_as is not None and counts["pending"]:
                self._close_left(one, row[2].decode(), close_as)
            if self._run(END, one, status, int(now), new_id("file-"), new_id("file-")):
                ended.append(one)
                self._ended(one)
        return ended

    def _close_left(self, batch: str, endpoint: str, why: str) -> None:
        """The items not run yet answered for, `PAGE` at a time: expired or cancelled."""
        while lines := [m.decode() for m in self._r.zrange(self._k("pending", batch), 0, PAGE - 1)]:
            items = self._r.hmget(self._k("items", batch), lines)
            pairs: list[Any] = []
            for line, item in zip(lines, items, strict=True):
                custom_id = json.loads(item)[2]
                pairs += [line, closed_line(endpoint, f"{batch}-{int(line)}", custom_id, why)]
            self._run(CLOSE, batch, why, *pairs)

    def _ended(self, batch: str) -> None:
        """A batch ended: its input file, deleted while it ran, goes now (unless another batch
        still runs from it)."""
        source = self._r.hget(self._k("batch", batch), "input_file_id")
        row = self._r.hmget(self._k("file", (source or b"").decode()), "deleted", "bytes")
        if source is not None and row[0] == b"1":
            self._drop_input(source.decode(), int(row[1] or 0))

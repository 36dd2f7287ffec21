"""The batch runner: one leader per queue feeds its items to the dispatcher on free capacity.

An item is served as a job that never pays (`Job.free_only`), its deadline inside its batch's
window. An answer that says "not now" (429 or 503: every free candidate is cooling) puts the item
back until its Retry-After — when the quota resets, or a breaker or a connection may have
recovered, each try waiting longer — instead of spending anything; a final error
is the item's line in the error file; a 200 its line in the output file. Batches past their
window end `expired`, as OpenAI's do. The runner never dies: a round that fails is logged on its
task's health and the next one tries again.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import attrs
import trio

from lanes._core.batch.lines import answered_line, failed_line
from lanes._core.batch.queue import BatchQueue, Item, RunnerQueue
from lanes._core.model.statuses import BATCH_MIN_PAID_S
from lanes._core.runtime.tasks import TaskHealth

log = logging.getLogger("lanes")

LEASE_S = 15.0  # the leader's lease; renewed every round
IDLE_S = 5.0  # how long the runner sleeps when nothing is due (a new batch wakes it at once)
FAILED_PAUSE_S = 5.0  # after a round that failed
PURGE_EVERY_S = 3600.0  # how often batches past their retention are looked for
RETRY_S = 1.0  # an item that could not be run (not its answer's fault) is taken again after this
TALLY_S = 5.0  # how often the queue's batches and items are counted (for /metrics)
MIN_PAID_S = BATCH_MIN_PAID_S  # a paid try starts only with this long left of its window
YIELD_S = 1.0  # how often it looks again while interactive work waits
MIN_PUT_BACK_S = 1.0  # an item put back waits at least this long
MAX_BACKOFF_S = 60.0  # an item put back again and again waits at most this long between tries
# (a minute: per-minute quotas reset every minute; at 300 s a simulated day got 62 % of the bound)


@attrs.frozen
class ItemAnswer:
    """What serving one item gave: its status and JSON body, the job's id, and — for "not now"
    — when to try again (seconds)."""

    status: int
    body: bytes
    request_id: str
    retry_after_s: float | None = None
    cost_usd: float = 0.0  # what its paid attempts cost (settled by the ledger)


class ItemsLeft(Protocol):
    """Where work that can wait says how many items it has left (see `engine/backlog.py`)."""

    def left(self, source: str, items: int) -> None: ...


class ServeItem(Protocol):
    """Serve one item's body on `endpoint` for `client` within `deadline_s` — never paying, or,
    with `paid_cap` (USD), paying at most that for one attempt (under consent `allow`)."""

    def __call__(
        self,
        endpoint: str,
        body: bytes,
        client: str,
        deadline_s: float,
        paid_cap: float | None = None,
    ) -> Awaitable[ItemAnswer]: ...


class BatchRunner:
    """Runs `queue`'s items through `serve`, at most `concurrency` at once."""

    def __init__(
        self,
        queue: RunnerQueue,
        serve: ServeItem,
        *,
        now_wall: Callable[[], float],
        health: TaskHealth,
        concurrency: int = 4,
        retention_s: float = 7 * 86400.0,
        interactive_waiting: Callable[[], int] = lambda: 0,
        backlog: ItemsLeft | None = None,
    ) -> None:
        """`interactive_waiting`: how many interactive jobs wait for a free quota now — while
        any does, no item starts (they go first); `backlog` is told how many items are left
        (interactive jobs spare the quotas they need: `engine/backlog.py`)."""
        self._backlog = backlog
        self._queue, self._serve, self._now, self._health = queue, serve, now_wall, health
        self._waiting = interactive_waiting
        self._retention_s, self._purged_at = retention_s, 0.0
        self._slots = trio.CapacityLimiter(concurrency)
        self._owner = f"{host()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._wake = trio.Event()
        self._paying: dict[str, trio.Lock] = {}  # batch → held while one of its items pays
        self._running: set[tuple[str, int]] = set()  # (batch, line) of the items it runs
        self._counted_at = -TALLY_S
        self.tally: dict[str, dict[str, int]] = {"batches": {}, "items": {}}

    def wake(self) -> None:
        """Something changed (a batch created or cancelled): look now."""
        self._wake.set()

    async def run(self) -> None:
        """Forever: lead, end what is over, feed what is due, sleep until the next is."""
        async with trio.open_nursery() as nursery:
            while True:
                try:
                    pause = await self._round(nursery)
                    self._health.ok()
                except Exception as exc:  # the runner must not die: the next round tries again
                    self._health.failed(exc, "batch round failed")
                    pause = FAILED_PAUSE_S
                with trio.move_on_after(pause):
                    await self._wake.wait()
                self._wake = trio.Event()

    async def _round(self, nursery: trio.Nursery) -> float:
        """One look; returns how long to sleep before the next."""
        queue, now = self._queue, self._now()
        runs = frozenset(self._running)  # what it runs: what else it holds running is lost
        if not await trio.to_thread.run_sync(
            lambda: queue.lead(self._owner, now, LEASE_S, gone, running=runs)
        ):
            await self._count(now, ended=False)
            return LEASE_S / 3  # another process leads
        await self._count(now, ended=bool(await trio.to_thread.run_sync(queue.settle, now)))
        if now - self._purged_at >= PURGE_EVERY_S:  # what ended before the retention: deleted
            await trio.to_thread.run_sync(queue.purge, now - self._retention_s)
            self._purged_at = now
        if self._waiting():  # interactive work waits for a free quota: it goes first
            return YIELD_S
        room = int(self._slots.total_tokens - self._slots.borrowed_tokens)
        items = await trio.to_thread.run_sync(queue.take, now, room) if room else []
        for item in items:
            await self._slots.acquire_on_behalf_of(item)
            self._running.add((item.batch, item.line))
            nursery.start_soon(self._one, item)
        if len(items) == room:  # every slot busy: an item that ends wakes the runner
            return LEASE_S / 3
        due = await trio.to_thread.run_sync(queue.next_due, now)
        pause = IDLE_S if due is None else max(0.0, due - now)
        return min(pause, LEASE_S / 3)

    async def _count(self, now: float, *, ended: bool) -> None:
        """Count the queue's batches and items for /metrics (every process does), every few
        seconds and whenever a batch ended."""
        if ended or now - self._counted_at >= TALLY_S:
            self.tally, self._counted_at = await trio.to_thread.run_sync(self._queue.tally), now
            if self._backlog is not None:
                items = self.tally["items"]
                self._backlog.left("queue", items.get("pending", 0) + items.get("running", 0))

    async def _one(self, item: Item) -> None:
        try:
            await self._run(item)
        except Exception as exc:  # an item that could not be run is put back, never lost
            log.warning(
                "batch %s item %d: %s; taken again", item.batch, item.line, type(exc).__name__
            )
            try:
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(self._queue.later, item, self._now() + RETRY_S)
            except Exception:  # the store is down: the next lead takes it back (never raised
                pass  # into the nursery, the sidecar's)
        finally:
            self._running.discard((item.batch, item.line))
            self._slots.release_on_behalf_of(item)
            self.wake()

    async def _run(self, item: Item) -> None:
        raw = await trio.to_thread.run_sync(self._queue.body, item)
        body = _body(raw)
        answer = await self._serve(item.endpoint, body, item.client, item.expires_at - self._now())
        if answer.status != 200 and answer.retry_after_s is not None:
            if item.model is not None:  # its batch's items all name one model
                # at its Retry-After — the reset — and its batch's items (its model's) with it,
                # free capacity back within its window (else they are taken, and may pay)
                when = self._now() + put_back_for(answer.retry_after_s)
                if when < item.expires_at:
                    await trio.to_thread.run_sync(self._queue.hold, item.batch, when)
            else:  # each try waiting longer
                when = self._now() + put_back_for(answer.retry_after_s, item.tries)
            if when < item.expires_at:
                await trio.to_thread.run_sync(self._queue.later, item, when)
                return
            # free capacity can not serve it within its window: its batch's budget may
            answer = await self._pay(item, body) or answer
            if answer.status != 200 and answer.retry_after_s is not None:
                await trio.to_thread.run_sync(self._queue.later, item, float(item.expires_at))
                return  # it expires with its window
        await self._answered(item, answer)

    async def _answered(self, item: Item, answer: ItemAnswer) -> None:
        """The item's answer, written with the mark that it is done."""
        queue, item_id = self._queue, f"{item.batch}-{item.line}"
        if answer.status == 200:
            line = answered_line(
                item.endpoint, item_id, item.custom_id, answer.request_id, answer.body
            )
        else:
            line = failed_line(item.endpoint, item_id, item.custom_id, answer.status,
                               answer.request_id, _json(answer.body))  # fmt: skip
        ok = answer.status == 200
        await trio.to_thread.run_sync(lambda: queue.finish(item, ok=ok, line=line))

    async def _pay(self, item: Item, body: bytes) -> ItemAnswer | None:
        """One paid try of `item` on what is left of its batch's budget (one item of a batch at
        a time), or None when nothing is left. The budget holds all it has left for the try and
        settles to what the try cost; should this process die mid-try, the next leader counts it
        spent in full (`budget.py`)."""
        queue, lock = self._queue, self._paying.setdefault(item.batch, trio.Lock())
        try:
            return await self._pay_held(queue, lock, item, body)
        finally:
            if not lock.locked() and not lock.statistics().tasks_waiting:
                self._paying.pop(item.batch, None)  # kept only while one of its items pays

    async def _pay_held(
        self, queue: RunnerQueue, lock: trio.Lock, item: Item, body: bytes
    ) -> ItemAnswer | None:
        async with lock:
            left = item.expires_at - self._now()
            if left < MIN_PAID_S:  # its window ends: no paid try starts now
                return None
            room = await trio.to_thread.run_sync(queue.paid_room, item.batch)
            if not room > 0 or not await trio.to_thread.run_sync(queue.hold_paid, item, room):
                return None  # nothing left, or the batch no longer runs (cancelled, ended)
            cost = room  # an exit we did not see the end of counts it all
            try:
                answer = await self._serve(item.endpoint, body, item.client, left, room)
                cost = answer.cost_usd
                return answer
            finally:
                with trio.CancelScope(shield=True):
                    spent = await trio.to_thread.run_sync(queue.settle_paid, item.batch, cost)
                if spent > room + 1e-12:
                    log.warning(
                        "batch %s: a paid try cost $%.6f, over the $%.6f it held (its upstream "
                        "billed past the worst case its request allowed); nothing is left to pay",
                        item.batch, spent, room,
                    )  # fmt: skip


def put_back_for(retry_after_s: float, tries: int | None = None) -> float:
    """How long an item (or a library batch's job) told "not now" waits before its next try:
    where the items like it are held back meanwhile (`tries` None: its batch's, or a library
    batch's jobs of its model), its Retry-After (the reset), at least `MIN_PUT_BACK_S`; else,
    after its `tries`-th try, its Retry-After, and each try longer (2^tries s), to
    `MAX_BACKOFF_S`."""
    if tries is None:
        return max(retry_after_s, MIN_PUT_BACK_S)
    return max(retry_after_s, min(2.0**tries, MAX_BACKOFF_S))


def host() -> str:
    """This process's host, as a lease holder names it: its name and its PID namespace (two
    containers may share a name — host networking — and never a PID namespace)."""
    try:
        space = os.readlink("/proc/self/ns/pid").strip("pid:[]")
    except OSError:
        space = ""
    return f"{socket.gethostname()}/{space}"


def gone(owner: str) -> bool:
    """Whether the lease holder `owner` ("host:pid:token") is a process of this host (`host`)
    that is no longer running (one of another host is trusted until its lease runs out)."""
    where, _, rest = owner.partition(":")
    pid = rest.partition(":")[0]
    if where != host() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _body(raw: bytes) -> bytes:
    """The `body` of an item's line (checked when its batch was created), as JSON bytes."""
    import json

    return json.dumps(json.loads(raw)["body"]).encode()


def _json(raw: bytes) -> dict[str, Any]:
    import json

    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


@attrs.frozen
class Batches:
    """One sidecar's batch queue and its runner; `limiter`: the queue's calls, one at a time;
    `parsing`: the parses of inline batches (a Message Batch's requests, up to 32 MB), one at a
    time — apart from the queue's calls, which a parse of seconds would otherwise hold up for
    every client and the runner."""

    queue: BatchQueue
    runner: BatchRunner
    limiter: trio.CapacityLimiter = attrs.field(factory=lambda: trio.CapacityLimiter(1))
    parsing: trio.CapacityLimiter = attrs.field(factory=lambda: trio.CapacityLimiter(1))

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` on the queue, in a worker thread."""
        return await trio.to_thread.run_sync(fn, *args, limiter=self.limiter)

    async def parse(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` — a parse or write of an inline batch, no queue call — in a worker
        thread, one at a time (what it holds in memory is bounded by one)."""
        return await trio.to_thread.run_sync(fn, *args, limiter=self.parsing)

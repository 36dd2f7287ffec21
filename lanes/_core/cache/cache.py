"""One dispatcher's response cache: the rules (`rules.py`) over the entries (`store.py`).

A read is made before a job walks (inline for SQLite, in a worker thread for Redis); an answer to
keep is handed to a writer task through a queue bounded in bytes, so a miss waits for no write —
beyond the bound, an answer is not kept (counted as dropped). A sweeper deletes the entries past
their TTL, a few at a time. A store that fails is a miss, never an error: the job is served as if
the cache were off, and the writer's health says why.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import trio

from lanes._core.cache.rules import (
    OFF,
    CachePlan,
    cache_key,
    choices_asked,
    plan,
    servable,
    storable_route,
    tier_of,
    whole,
)
from lanes._core.cache.store import Entries, Entry
from lanes._core.config.schema import CacheConfig, CacheMode, ClientConfig
from lanes._core.model.job import Job
from lanes._core.runtime.tasks import TaskHealth

log = logging.getLogger("lanes")

#: Answers waiting for the writer, at most, in bytes: beyond, an answer is not kept.
MAX_PENDING_BYTES = 64 * 1024 * 1024
#: How long the writer gathers answers before it writes them, in one transaction: a miss then
#: costs a share of one write, not a write (this process reads them meanwhile, `_waiting`).
GROUP_S = 0.05
#: After a read fails (a store that stalls: a timeout), the next jobs do not read for this long,
#: seconds — misses at once: a stalled store costs one job a read's timeout, not every job.
READ_COOLDOWN_S = 5.0
#: How often the entries past their TTL are deleted, seconds; and how many at most in one go (no
#: store is held long: a day's answers expiring at once go in turns).
SWEEP_S = 60.0
SWEEP_BATCH = 256


@attrs.frozen
class Served:
    """Who made an answer, and what it cost: what an entry keeps beside it."""

    lane: str
    model: str
    provider: str
    route: str
    cost_usd: float = 0.0


@attrs.frozen(kw_only=True)
class CacheStatistics:
    """What the cache did since this process started, and what it holds now (None: not read)."""

    mode: str
    hits: int
    misses: int
    bypassed: int
    kept: int
    dropped: int
    saved_tokens: int
    saved_usd: float
    entries: int | None = None
    bytes: int | None = None


class ResponseCache:
    def __init__(
        self,
        config: CacheConfig,
        clients: Mapping[str, ClientConfig],
        entries: Entries,
        *,
        now_wall: Callable[[], float],
        health: TaskHealth,
        inline_reads: bool,
        quarantined: Callable[[str], str | None] = lambda key: None,
    ) -> None:
        """`inline_reads`: the entries are a local SQLite file, read without a worker thread;
        `quarantined`: why the canary keeps a free "lane/model" out of routing now, or None."""
        self.config = config
        self.entries = entries
        self._quarantined = quarantined
        self._modes = {name: c.cache for name, c in clients.items() if c.cache is not None}
        self._now_wall = now_wall
        self._health = health
        self._inline = inline_reads
        self._send, self._receive = trio.open_memory_channel[Entry](1024)
        self._pending = 0
        self._idle = trio.Event()  # set while nothing waits for the writer
        self._turn = trio.Lock()  # a batch's look at what was cleared and its write; a clear
        self._reads_back_at = 0.0  # trio's clock: no read before (one failed)
        self._waiting: dict[str, Entry] = {}  # handed to the writer, not written yet: read too
        self._cleared: dict[str | None, float] = {}  # when a client's (None: every) entries went
        self._idle.set()
        self._counts: Counter[str] = Counter()
        self._saved_usd = 0.0

    def mode(self, client: str) -> CacheMode:
        """The cache's mode for `client`: its own entry's, else the section's — and off for every
        client while the section's is off."""
        if self.config.mode == "off":
            return "off"
        return self._modes.get(client, self.config.mode)

    def plan(self, job: Job) -> CachePlan:
        """What `job` does with the cache (see `rules.plan`)."""
        mode = self.mode(job.client)
        return OFF if mode == "off" else plan(mode, job, any_sampling=self.config.any_sampling)

    def key(self, job: Job) -> str:
        return cache_key(job)

    async def find(self, job: Job, key: str) -> tuple[Entry, dict[str, Any]] | None:
        """The entry `job` may be answered with, and what it keeps, parsed (`Assembler.kept`); or
        None (a store that fails, or an entry this version can not give back: None, and said; for
        `READ_COOLDOWN_S` after a read failed, None without reading)."""
        now, ttl = self._now_wall(), self.config.ttl_s
        if key not in self._waiting and trio.current_time() < self._reads_back_at:
            return None  # a read failed a moment ago: a miss at once
        try:
            if key in self._waiting:
                entry: Entry | None = self._waiting[key]
            elif self._inline:
                entry = self.entries.get(key, now, ttl)
            else:
                entry = await trio.to_thread.run_sync(self.entries.get, key, now, ttl)
        except Exception as exc:  # the store's own errors: a miss, never the job's failure
            self._health.failed(exc, "read")
            self._reads_back_at = trio.current_time() + READ_COOLDOWN_S
            return None
        if entry is None or not self._servable(entry, job):
            return None
        kept = self._readable(entry)
        return None if kept is None else (entry, kept)

    def _servable(self, entry: Entry, job: Job) -> bool:
        """Whether `entry` may answer `job`: its client's, its route one the job may be served
        (`rules.servable`), and not made by a free model the canary has quarantined since (its
        answers went quietly worse: those it made before the canary saw it are among them)."""
        if entry.client != job.client:
            return False
        if not servable(entry.route, job, keep_paid=self.config.keep_paid):
            return False
        free = tier_of(entry.route) == "free"
        return not free or self._quarantined(f"{entry.lane}/{entry.model}") is None

    def _readable(self, entry: Entry) -> dict[str, Any] | None:
        """What `entry` keeps, parsed, when this version can give it back — a whole completion,
        and a stream's chunks as text; else None, said (another version's format, or damaged)."""
        try:
            kept: dict[str, Any] = json.loads(entry.body)
            stream = kept.get("stream", []) if isinstance(kept, dict) else None
            if not isinstance(stream, list) or not whole(kept.get("completion")):
                raise ValueError("an entry this version can not give back")
            if not all(isinstance(data, str) for data in stream):
                raise ValueError("an entry whose stream is not text")
        except ValueError as exc:
            self.unreadable(exc)
            return None
        return kept

    def unreadable(self, exc: ValueError) -> None:
        """An entry found that can not be given back: a miss, said in the cache's health."""
        self._health.failed(exc, "read")

    def counted(self, status: str, *, tokens: int = 0, saved_usd: float = 0.0) -> None:
        """One answer's `X-Lanes-Cache`, and what a hit saved."""
        self._counts[status] += 1
        self._counts["saved_tokens"] += tokens
        self._saved_usd += saved_usd

    def keep(
        self, job: Job, key: str, kept: Mapping[str, Any], served: Served, raw: bytes = b""
    ) -> bool:
        """Hand a whole answer to the writer — `{"completion": …}`, and `"stream"` when it was
        streamed (`Assembler.kept`); False when it is not kept (not whole, paid without
        `keep_paid`, over `max_entry_kb`, or the writer's queue full). `raw`: the completion's
        bytes as the upstream sent them (kept as they are, not encoded again)."""
        if not storable_route(served.route, keep_paid=self.config.keep_paid):
            return False
        if not whole(kept.get("completion"), choices_asked(job)):
            return False
        if raw and set(kept) == {"completion"}:
            raw = b'{"completion":' + raw + b"}"
        else:
            text = json.dumps(kept, separators=(",", ":"), ensure_ascii=False)
            raw = text.encode("utf-8", "surrogatepass")
        if len(raw) > self.config.max_entry_kb * 1024:
            return False
        made_at = self._now_wall()
        entry = Entry(
            key=key,
            client=job.client,
            made_at=made_at,
            body=raw,
            lane=served.lane,
            model=served.model,
            provider=served.provider,
            route=served.route,
            cost_usd=served.cost_usd,
        )
        if self._pending + len(raw) > MAX_PENDING_BYTES:
            self._counts["dropped"] += 1
            self._health.dropped("cache writes")
            return False
        try:
            self._send.send_nowait(entry)
        except trio.WouldBlock:
            self._counts["dropped"] += 1
            self._health.dropped("cache writes")
            return False
        if not self._pending:
            self._idle = trio.Event()
        self._pending += len(raw)
        self._waiting[key] = entry
        return True

    async def run(self) -> None:
        """The writer: store each answer handed over, evicting the oldest over `max_mb`."""
        max_bytes = int(self.config.max_mb * 1_000_000)
        async for entry in self._receive:
            await trio.sleep(GROUP_S)  # what comes meanwhile is written with it, in one go
            batch = [entry, *self._ready()]
            async with self._turn:  # no clear between the look and the write
                await self._write(batch, max_bytes)

    async def _write(self, batch: list[Entry], max_bytes: int) -> None:
        fresh = [e for e in batch if not self._cleared_since(e)]
        try:
            if self._inline:  # a local file: one short transaction, no thread to hand it to
                self.entries.put(fresh, max_bytes, self.config.ttl_s)
            else:
                ttl_s = self.config.ttl_s
                await trio.to_thread.run_sync(self.entries.put, fresh, max_bytes, ttl_s)
        except Exception as exc:  # the store's own errors: these answers are not kept
            self._health.failed(exc, "write")
        else:
            self._counts["kept"] += len(fresh)
            self._health.ok()
        finally:
            self._written(batch)

    async def sweep(self) -> None:
        """The sweeper: every `SWEEP_S`, delete the entries past their TTL (`expired`); at its
        start and then each round, say (once a change) how the entries may crowd the state
        store's memory (`Entries.memory_note`)."""
        said = ""
        while True:
            said = await self._memory(said)
            await trio.sleep(SWEEP_S)
            await self.expired()

    async def _memory(self, said: str) -> str:
        """The store's memory note, logged when it is not `said` (the last one); returns it."""
        max_bytes = int(self.config.max_mb * 1_000_000)
        try:
            note = await trio.to_thread.run_sync(self.entries.memory_note, max_bytes)
        except Exception as exc:  # the store's own errors: said by its health, asked next round
            self._health.failed(exc, "memory")
            return said
        if note and note != said:
            log.warning("%s", note)
        return note

    async def expired(self) -> int:
        """Delete the entries made more than `ttl_s` ago, `SWEEP_BATCH` at a time in a worker
        thread; how many went (a store that fails: said, and tried again next sweep)."""
        before, gone = self._now_wall() - self.config.ttl_s, 0
        while True:
            try:
                went = await trio.to_thread.run_sync(self.entries.expire, before, SWEEP_BATCH)
            except Exception as exc:  # the store's own errors
                self._health.failed(exc, "expire")
                return gone
            gone += went
            if went < SWEEP_BATCH:
                return gone

    def _ready(self) -> list[Entry]:
        """The answers handed over meanwhile: written with the first, in one go."""
        more = []
        while True:
            try:
                more.append(self._receive.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                return more

    def _cleared_since(self, entry: Entry) -> bool:
        """Whether its client's entries (or every one) were cleared after it was made."""
        at = max(self._cleared.get(None, 0.0), self._cleared.get(entry.client, 0.0))
        return entry.made_at <= at

    def _written(self, batch: list[Entry]) -> None:
        for entry in batch:
            if self._waiting.get(entry.key) is entry:
                del self._waiting[entry.key]
            self._pending -= entry.size
        if not self._pending:
            self._idle.set()

    async def settled(self) -> None:
        """Wait until every answer handed over so far is written (for tests and `lanes cache`)."""
        await self._idle.wait()

    async def clear(self, client: str | None) -> int:
        """Delete `client`'s entries (every one for None), those waiting for the writer too; how
        many were stored. Between the writer's batches (a batch being written is deleted after
        it, one written later is looked at after this), the store's part in a worker thread."""
        async with self._turn:
            self._cleared[client] = self._now_wall()
            for key, entry in list(self._waiting.items()):
                if client is None or entry.client == client:
                    del self._waiting[key]
            return await trio.to_thread.run_sync(self.entries.clear, client)

    def statistics(self, *, sizes: bool = False) -> CacheStatistics:
        counts = self._counts
        held = self.entries.sizes() if sizes else (None, None)
        return CacheStatistics(
            mode=self.config.mode,
            hits=counts["hit"],
            misses=counts["miss"],
            bypassed=counts["bypass"],
            kept=counts["kept"],
            dropped=counts["dropped"],
            saved_tokens=counts["saved_tokens"],
            saved_usd=round(self._saved_usd, 6),
            entries=held[0],
            bytes=held[1],
        )

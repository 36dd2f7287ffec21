"""One streamed job, however many walks it takes: the first, and those that resume a broken answer.

Every walk of a streamed job continues the job's one record, so the budgets the policy gives a job
(`free_attempts`, `paid_attempts`, `transient_retries`) hold across a recovery, every attempt and
every cent lands in the job's story, and the job leaves exactly one audit row — written when the
job is over, not when its first upstream broke.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from lanes._core.cache.replay import CachedStream
from lanes._core.cache.rules import Assembler, Status
from lanes._core.engine.calls import stream_call
from lanes._core.engine.context import Routing
from lanes._core.engine.stream import AnswerStream, ReplyStream
from lanes._core.engine.walk import walk
from lanes._core.model.errors import JobFailed
from lanes._core.model.job import Job
from lanes._core.model.record import JobRecord


class StreamJob:
    """A streamed job's walks over its one record. Open a stream with `open()`; the dispatcher
    audits the job once with `ended()` when the job is over."""

    def __init__(
        self,
        routing: Routing,
        record: JobRecord,
        *,
        hit: CachedStream | None = None,
        cache: Status | None = None,
        keep: Assembler | None = None,
    ) -> None:
        """`hit`: the response cache's answer, served by the first `open()` instead of a walk;
        `cache`: what the cache says of a fresh answer; `keep`: the first stream's answer is put
        together in it, for the cache."""
        self.routing = routing
        self.record = record
        self.origin = record.job  # the job as the caller sent it: what the audit describes
        self._hit, self._cache, self._keep = hit, cache, keep
        self._first: ReplyStream | None = None  # the first walk's stream
        self._last: AnswerStream | None = None  # the stream that served (or broke) last
        self._before = ""  # the text delivered before `_last` took over by continuing it
        self._failure: str | None = None  # the error code of the last walk that found no stream
        self._interrupted = False  # the caller was told the stream broke (no recovery held)
        # the last stream the upstream broke, and the text delivered before it took over
        self._broke: tuple[AnswerStream, str] | None = None

    @asynccontextmanager
    async def open(
        self,
        job: Job | None = None,
        *,
        exclude: frozenset[str] = frozenset(),
        require_prefill: bool = False,
    ) -> AsyncIterator[AnswerStream]:
        """Walk for a stream; `job` (same id and deadline) replaces the conversation sent, e.g. with
        the delivered text as a trailing assistant message. Raises what a walk raises. The first
        open of a job the response cache answers is its hit, and walks nowhere."""
        if self._hit is not None:
            hit, self._hit = self._hit, None
            self._last, self._failure = hit, None
            try:
                yield hit
            finally:
                hit.close()
            return
        record = self.record
        before = self._last.delivered_text if self._last is not None and require_prefill else ""
        if job is not None:
            record.sending(job)
        async with AsyncExitStack() as keep:
            try:
                stream = await walk(
                    self.routing,
                    record,
                    stream_call,
                    keep,
                    exclude=exclude,
                    require_prefill=require_prefill,
                )
            except JobFailed as exc:
                self._failure = record.attach(exc).code
                raise
            finally:
                record.sending(self.origin)
            first = self._first is None and self._last is None
            stream.keep_answer(self._cache, self._keep if first else None)
            self._first = stream if first else self._first
            self._last, self._before, self._failure = stream, before, None
            try:
                yield stream
            finally:
                stream.close()
                if stream.outcome not in ("ok", "abandoned", "discarded"):
                    self._broke = (stream, before)

    def whole_answer(self) -> tuple[dict[str, Any], ReplyStream] | None:
        """The answer for the response cache, and the stream that gave it: only the first walk's,
        when it ended well and whole, with no recovery after it."""
        first = self._first
        if first is None or first is not self._last or self._broke is not None:
            return None
        body = first.kept_answer()
        return None if body is None else (body, first)

    def interrupted(self) -> None:
        """The caller is told the stream broke: no recovery carried it on."""
        self._interrupted = True

    def ended(self) -> dict[str, Any]:
        """What the job's audit row says it ended with — `outcome`, naming who ended it: `ok`; how
        the upstream broke it (`fault`, `rate_limited`, …) when no recovery carried it on, even
        if a recovery's stream was dropped after; `abandoned` only when the caller stopped
        reading — and who served what."""
        last, before = self._last, self._before
        if last is None:
            return {"outcome": self._failure or "abandoned"}  # no walk found a stream, or cancelled
        if self._interrupted and self._broke is not None:
            last, before = self._broke  # what the caller was served, and how it broke
        ended: dict[str, Any] = {
            "outcome": last.outcome or "abandoned",
            "served": last.candidate.key,
            "answer": before + last.delivered_text,
            "usage": last.usage,
        }
        if isinstance(last, CachedStream):
            ended |= {"route": "cache", "saved_usd": last.saved_usd}
        return ended


@asynccontextmanager
async def stream_job(
    routing: Routing, record: JobRecord, finish: Callable[..., None], **cache: Any
) -> AsyncIterator[StreamJob]:
    """A `StreamJob` for `record` (with what the response cache gives it, `cache`), audited through
    `finish(record, outcome, ...)` once it is over, on every exit path (a cancelled caller is
    audited too)."""
    job = StreamJob(routing, record, **cache)
    try:
        yield job
    finally:
        finish(record, **job.ended())

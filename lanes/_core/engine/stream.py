"""A streamed reply the caller iterates: OpenAI chunks, bounded by the job's deadline and idle time.

Each read runs under `move_on_at(min(job deadline, now + idle_s))`; no cancel scope spans a yield,
so the caller's own code between chunks is never cancelled by ours. A stream that stalls, is cut,
or outlives the deadline after chunks were delivered raises `StreamInterrupted` — it never ends
as if it had finished. The attempt behind it ends when the stream ends, breaks or is closed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, Self

import attrs
import trio

from lanes._core.cache.rules import Assembler, Status
from lanes._core.engine.attempt import AttemptRun
from lanes._core.model.candidates import Attempt, Candidate, Outcome, Route
from lanes._core.model.errors import RetryableError, StreamInterrupted, UpstreamError
from lanes._core.model.job import Job
from lanes._core.upstream.bodies import ChunkReader, Received


def with_usage(job: Job) -> Job:
    """`job` asking its upstream to report usage at the end of a stream (OpenAI's
    `stream_options.include_usage`), whether or not the caller asked."""
    options = job.params.get("stream_options")
    options = dict(options) if isinstance(options, Mapping) else {}
    if options.get("include_usage") is True:
        return job
    return attrs.evolve(
        job, params={**job.params, "stream_options": {**options, "include_usage": True}}
    )


def wants_usage(job: Job) -> bool:
    """Did the caller ask for the usage chunk at the end of its stream?"""
    options = job.params.get("stream_options")
    return isinstance(options, Mapping) and options.get("include_usage") is True


async def first_chunks(reader: ChunkReader) -> list[Received]:
    """Wait (under the caller's scope) for the first chunks; keep-alives do not count."""
    while True:
        chunks = await reader.receive()
        if chunks is None:
            raise RetryableError("stream ended before its first chunk", category="stream_cut")
        if chunks:
            return chunks


class AnswerStream(Protocol):
    """A streamed answer as its reader sees it: an upstream's (`ReplyStream`) or the response
    cache's (`cache/replay.py`'s `CachedStream`)."""

    @property
    def candidate(self) -> Candidate: ...
    @property
    def provider(self) -> str: ...
    @property
    def route(self) -> Route: ...
    @property
    def request_id(self) -> str: ...
    @property
    def deadline_at(self) -> float: ...
    @property
    def lane(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def attempts(self) -> tuple[Attempt, ...]: ...
    @property
    def attempt_count(self) -> int: ...
    @property
    def buffered(self) -> int: ...
    @property
    def usage(self) -> dict[str, Any] | None: ...
    @property
    def finish_reason(self) -> str | None: ...
    @property
    def cost_usd(self) -> float: ...
    @property
    def job_cost_usd(self) -> float: ...
    @property
    def outcome(self) -> Outcome | None: ...
    @property
    def delivered_text(self) -> str: ...
    @property
    def delivered_tool_calls(self) -> bool: ...
    @property
    def chunks_delivered(self) -> int: ...
    @property
    def cache(self) -> Status | None: ...
    @property
    def age_s(self) -> float | None: ...

    def __aiter__(self) -> Self: ...
    async def __anext__(self) -> dict[str, Any]: ...
    async def next_chunk(self) -> Received | None: ...
    def close(self) -> None: ...
    def discard(self, why: str) -> None: ...


class ReplyStream:
    """Chunks from the lane that answered first, plus who that was. Iterate with `async for`, or
    with `next_chunk()` for each chunk's upstream text too."""

    def __init__(self, *, run: AttemptRun, reader: ChunkReader, buffered: list[Received]) -> None:
        self._run = run
        self._reader = reader
        self._pass_usage = wants_usage(run.record.job)  # the caller asked for the usage chunk
        self._buffered: deque[Received] = deque()
        self._keep(buffered)
        self._idle_s = run.lane.config.idle_s
        self._outcome: Outcome | None = None
        self._texts: list[str] = []  # content deltas handed to the caller so far
        self.delivered_tool_calls = False  # a tool-call delta was handed over (no safe resume)
        self.chunks_delivered = 0
        self._cache: Status | None = None  # what the response cache said of this job
        self._kept: Assembler | None = None  # the answer put together for the response cache

    @property
    def cache(self) -> Status | None:
        """What the response cache did for this job (`X-Lanes-Cache`): miss or bypass; None: off."""
        return self._cache

    @property
    def age_s(self) -> float | None:
        return None  # a fresh answer

    def keep_answer(self, status: Status | None, assembler: Assembler | None) -> None:
        """Say what the cache did, and put the answer together in `assembler` as it is read."""
        self._cache, self._kept = status, assembler

    def kept_answer(self) -> dict[str, Any] | None:
        """The whole answer put together for the cache (`Assembler.kept`): None unless it ended
        well and whole."""
        if self._kept is None or self._outcome != "ok":
            return None
        return self._kept.kept(self._reader.usage)

    @property
    def delivered_text(self) -> str:
        """The content deltas handed to the caller so far, joined."""
        if len(self._texts) > 1:
            self._texts[:] = ["".join(self._texts)]
        return self._texts[0] if self._texts else ""

    @property
    def candidate(self) -> Candidate:
        return self._run.candidate

    @property
    def provider(self) -> str:
        return self._run.lane.spec.provider

    @property
    def route(self) -> Route:
        return self._run.route

    @property
    def request_id(self) -> str:
        return self._run.record.id

    @property
    def deadline_at(self) -> float:
        return self._run.record.deadline_at

    @property
    def lane(self) -> str:
        return self.candidate.lane

    @property
    def model(self) -> str:
        return self.candidate.model

    @property
    def attempts(self) -> tuple[Attempt, ...]:
        """Every attempt so far; this stream's own counts once it has ended."""
        return tuple(self._run.record.attempts)

    @property
    def attempt_count(self) -> int:
        return len(self._run.record.attempts) + (self._outcome is None)

    @property
    def buffered(self) -> int:
        """Chunks already read from the upstream and not yet handed over."""
        return len(self._buffered)

    @property
    def usage(self) -> dict[str, Any] | None:
        usage = self._reader.usage
        return dict(usage) if usage is not None else None

    @property
    def finish_reason(self) -> str | None:
        return self._reader.finish_reason

    @property
    def malformed_chunks(self) -> int:
        return self._reader.malformed

    @property
    def cost_usd(self) -> float:
        """What the ledger settled for this stream (0 until it has ended; free and local cost 0)."""
        return self._run.cost_usd

    @property
    def job_cost_usd(self) -> float:
        """What the job has cost so far: every attempt's settled figure, this stream's included."""
        return sum(a.cost_usd for a in self._run.record.attempts)

    @property
    def outcome(self) -> Outcome | None:
        """How this stream's attempt ended (None while it is still being read)."""
        return self._outcome

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> dict[str, Any]:
        received = await self.next_chunk()
        if received is None:
            raise StopAsyncIteration
        return received[0]

    async def next_chunk(self) -> Received | None:
        """The next chunk with its `data` as the upstream sent it, or None once the stream has
        ended properly. Raises `StreamInterrupted` for a stall, a cut or the deadline."""
        while not self._buffered:
            if self._outcome is not None:
                return None
            now = trio.current_time()
            with trio.move_on_at(min(self.deadline_at, now + self._idle_s)):
                try:
                    arrived = await self._reader.receive()
                except UpstreamError as exc:
                    raise self._broken(exc) from exc
                if arrived is None:
                    self._finish("ok")
                    return None
                self._keep(arrived)
                continue
            if trio.current_time() >= self.deadline_at:
                raise self._interrupted(
                    "deadline", "the job's deadline passed mid-stream", "deadline"
                )
            raise self._interrupted(
                "fault", f"stream stalled: no bytes for {self._idle_s:g}s", "stream_stall"
            )
        received = self._buffered.popleft()
        self._note(received[0])
        if self._kept is not None:
            self._kept.add(received[0], received[1])
        return received

    def _keep(self, received: Iterable[Received]) -> None:
        """Buffer what the caller will be handed: a usage chunk it did not ask for is our ledger's
        (the reader has counted it), not passed on."""
        if self._pass_usage:
            self._buffered.extend(received)
            return
        for chunk, raw in received:
            if chunk.get("choices") or "usage" not in chunk:
                self._buffered.append((chunk, raw))

    def close(self) -> None:
        """Settle the attempt if the caller stopped reading early (counts against nobody)."""
        if self._outcome is None:
            self._finish("abandoned", "the caller stopped reading")

    def discard(self, why: str) -> None:
        """Stop reading it ourselves (a recovery's answer that can not be spliced on): not the
        caller's doing, and not the upstream's fault."""
        if self._outcome is None:
            self._finish("discarded", why)

    def _note(self, chunk: dict[str, Any]) -> None:
        self.chunks_delivered += 1
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if isinstance(delta, dict):
                if isinstance(content := delta.get("content"), str) and content:
                    self._texts.append(content)
                if delta.get("tool_calls"):
                    self.delivered_tool_calls = True

    def _finish(self, outcome: Outcome, detail: str = "", category: str = "") -> None:
        self._outcome = outcome
        self._run.end(
            outcome,
            status=200,
            detail=detail,
            category=category,
            usage=self._reader.usage if outcome == "ok" else None,
        )

    def _broken(self, exc: UpstreamError) -> StreamInterrupted:
        """The stream failed mid-answer: ended by what the provider said in it (a rate limit is
        not a fault, a 400 is final: its class's outcome), else as a fault (a cut, garbage)."""
        if not exc.in_band:
            return self._interrupted("fault", str(exc), exc.category)
        self._outcome = self._run.fail(exc).outcome
        return self._error(str(exc), exc.status, exc.code)

    def _interrupted(self, outcome: Outcome, detail: str, category: str) -> StreamInterrupted:
        self._finish(outcome, detail, category)
        return self._error(detail)

    def _error(
        self, detail: str, status: int | None = None, code: str | None = None
    ) -> StreamInterrupted:
        record = self._run.record
        return StreamInterrupted(
            f"{self.candidate.key}: {detail} after {self.chunks_delivered} chunk(s)",
            attempts=record.attempts,
            skips=record.skips,
            request_id=record.id,
            upstream_status=status,
            upstream_code=code,
        )

"""A streamed reply the caller iterates: OpenAI chunks, bounded by the job's deadline and idle time.

Each read runs under `move_on_at(min(job deadline, now + idle_s))`; no cancel scope spans a yield,
so the caller's own code between chunks is never cancelled by ours. A stream that stalls, is cut,
or outlives the deadline after chunks were delivered raises `StreamInterrupted` — it never ends
as if it had finished.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from lanes._core.errors import RetryableError, StreamInterrupted
from lanes._core.job import Attempt, Candidate, Outcome, Route, cost_usd
from lanes._core.upstream.client import ChunkReader

if TYPE_CHECKING:
    from lanes._core.routing.record import Walk


async def first_chunks(reader: ChunkReader) -> list[dict[str, Any]]:
    """Wait (under the caller's scope) for the first chunks; keep-alives do not count."""
    while True:
        chunks = await reader.receive()
        if chunks is None:
            raise RetryableError("stream ended before its first chunk")
        if chunks:
            return chunks


class ReplyStream:
    """Chunks from the lane that answered first, plus who that was. Iterate with `async for`."""

    def __init__(
        self,
        *,
        reader: ChunkReader,
        buffered: list[dict[str, Any]],
        candidate: Candidate,
        provider: str,
        route: Route,
        walk: Walk,
        started_at: float,
        idle_s: float,
        settle: Callable[[Outcome], None],
    ) -> None:
        self.candidate = candidate
        self.provider = provider
        self.route = route
        self._reader = reader
        self._buffered = list(buffered)
        self._walk = walk
        self._started_at = started_at
        self._idle_s = idle_s
        self._settle = settle
        self._outcome: Outcome | None = None
        self.delivered_text = ""  # content deltas handed to the caller so far
        self.delivered_tool_calls = False  # a tool-call delta was handed over (no safe resume)
        self.chunks_delivered = 0

    deadline_at = property(lambda self: self._walk.deadline_at)
    lane = property(lambda self: self.candidate.lane)
    model = property(lambda self: self.candidate.model)

    @property
    def attempts(self) -> tuple[Attempt, ...]:
        """Every attempt so far; this stream's own counts once it has ended."""
        return tuple(self._walk.attempts)

    @property
    def attempt_count(self) -> int:
        return len(self._walk.attempts) + (self._outcome is None)

    @property
    def usage(self) -> dict[str, Any] | None:
        return self._reader.usage

    @property
    def finish_reason(self) -> str | None:
        return self._reader.finish_reason

    @property
    def malformed_chunks(self) -> int:
        return self._reader.malformed

    @property
    def cost_usd(self) -> float:
        return cost_usd(self.candidate, self._reader.usage)

    def __aiter__(self) -> ReplyStream:
        return self

    async def __anext__(self) -> dict[str, Any]:
        while not self._buffered:
            if self._outcome is not None:
                raise StopAsyncIteration
            now = trio.current_time()
            with trio.move_on_at(min(self._walk.deadline_at, now + self._idle_s)):
                try:
                    chunks = await self._reader.receive()
                except RetryableError as exc:
                    raise self._interrupted("fault", str(exc)) from exc
                if chunks is None:
                    self._finish("ok")
                    raise StopAsyncIteration
                self._buffered.extend(chunks)
                continue
            if trio.current_time() >= self._walk.deadline_at:
                raise self._interrupted("deadline", "the job's deadline passed mid-stream")
            raise self._interrupted("fault", f"stream stalled: no bytes for {self._idle_s}s")
        chunk = self._buffered.pop(0)
        self._note(chunk)
        return chunk

    def close(self) -> None:
        """Settle the attempt if the caller stopped reading early (counts against nobody)."""
        if self._outcome is None:
            self._finish("abandoned")

    def _note(self, chunk: dict[str, Any]) -> None:
        self.chunks_delivered += 1
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if isinstance(delta, dict) and isinstance(delta.get("content"), str):
                self.delivered_text += delta["content"]
            if isinstance(delta, dict) and delta.get("tool_calls"):
                self.delivered_tool_calls = True

    def _finish(self, outcome: Outcome, detail: str = "") -> None:
        self._outcome = outcome
        self._settle(outcome)
        self._walk.record(self.candidate, outcome, self._started_at, status=200, detail=detail)

    def _interrupted(self, outcome: Outcome, detail: str) -> StreamInterrupted:
        self._finish(outcome, detail)
        return StreamInterrupted(
            f"{self.candidate.key}: {detail} after {self.chunks_delivered} chunk(s)",
            attempts=self._walk.attempts,
            skips=self._walk.skips,
        )

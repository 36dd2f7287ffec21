"""A streamed answer that survives its upstream breaking mid-answer — without lying.

Before the first chunk the dispatcher falls back freely. After chunks have reached the caller:
(a) resume on a candidate that continues a trailing assistant message (prefill): send it the
    conversation plus the text already delivered, and pass on only the continuation;
(b) otherwise (or when the prefill is rejected) regenerate on another candidate and pass on only
    what *exactly extends* the text already delivered;
(c) otherwise end with an in-band error naming the real failure — never the fallback's own.
A truncated answer never ends in a clean finish. An error the provider sent in its stream saying the
request itself is at fault (a 400, 401, 403, 413, 422) is not tried elsewhere: it is passed on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import attrs
import trio

from lanes._core.engine.session import StreamJob
from lanes._core.engine.stream import AnswerStream
from lanes._core.model.errors import JobFailed, StreamInterrupted
from lanes._core.model.job import Job
from lanes._core.upstream.responses import FINAL_STATUSES


@attrs.frozen
class Started:
    """The first candidate answered: its stream (who serves, which route) before any chunk."""

    stream: AnswerStream


@attrs.frozen
class Chunk:
    """One `chat.completion.chunk` to pass on. `raw` is its `data` exactly as the upstream sent it,
    when it is passed on unchanged (None for a chunk recovery rewrote)."""

    data: dict[str, Any]
    raw: str | None = None


@attrs.frozen
class Ended:
    """The answer is complete (`stream` is the one that finished it)."""

    stream: AnswerStream


@attrs.frozen
class Failed:
    """No candidate answered before the first chunk: a real HTTP error can still be sent."""

    error: JobFailed


@attrs.frozen
class Broken:
    """The answer broke after chunks were sent and could not be recovered: an in-band error."""

    error: StreamInterrupted


Event = Started | Chunk | Ended | Failed | Broken
Emit = Callable[[Event], Awaitable[None]]


class Streams(Protocol):
    """The dispatcher's streaming door, as recovery needs it."""

    def stream_job(self, job: Job) -> AbstractAsyncContextManager[StreamJob]: ...


def _content(chunk: Mapping[str, Any]) -> str | None:
    """The content delta of a single-choice chunk ('' for none), or None when it carries more."""
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    delta = choices[0].get("delta") if isinstance(choices[0], Mapping) else None
    if not isinstance(delta, Mapping) or delta.get("tool_calls"):
        return None
    return delta.get("content") or ""


def _with_content(chunk: dict[str, Any], text: str, chunk_id: str | None) -> dict[str, Any]:
    out = {
        **chunk,
        "choices": [
            {**chunk["choices"][0], "delta": {**chunk["choices"][0]["delta"], "content": text}}
        ],
    }
    if chunk_id:
        out["id"] = chunk_id
    return out


async def relay(dispatcher: Streams, job: Job, emit: Emit) -> None:
    """Stream `job` through `emit`, recovering after a mid-answer break as the module says. Every
    walk continues the job's one record: its attempt budgets hold across a recovery, and it is
    audited once, with every attempt, when it is over."""
    async with dispatcher.stream_job(job) as streamed:
        await _relay(streamed, emit)


async def _relay(streamed: StreamJob, emit: Emit) -> None:
    try:
        async with streamed.open() as stream:
            await emit(Started(stream))
            chunk_id = None
            try:
                while (received := await stream.next_chunk()) is not None:
                    chunk, raw = received
                    chunk_id = chunk_id or chunk.get("id")
                    await emit(Chunk(chunk, raw))
            except StreamInterrupted as exc:
                broken, delivered, tools, failed = (
                    exc,
                    stream.delivered_text,
                    stream.delivered_tool_calls,
                    stream.candidate.key,
                )
                deadline_at = stream.deadline_at
            else:
                await emit(Ended(stream))
                return
    except JobFailed as exc:
        if isinstance(exc, StreamInterrupted):
            raise
        await emit(Failed(exc))
        return
    if tools or trio.current_time() >= deadline_at or broken.upstream_status in FINAL_STATUSES:
        streamed.interrupted()
        await emit(Broken(broken))  # a request the provider refused mid-answer is refused anywhere
        return
    sent = {"any": False}  # once a recovery has passed text on, no other may start over

    async def counted(event: Event) -> None:
        sent["any"] = sent["any"] or isinstance(event, Chunk)
        await emit(event)

    if await _prefill(streamed, delivered, failed, chunk_id, counted):
        return
    if not sent["any"] and await _regenerate(streamed, delivered, failed, chunk_id, counted):
        return
    streamed.interrupted()
    await emit(Broken(broken))


async def _prefill(
    streamed: StreamJob, delivered: str, failed: str, chunk_id: str | None, emit: Emit
) -> bool:
    """(a): continue the delivered text on a prefill-capable candidate. False when none could."""
    job = streamed.origin
    prefilled = attrs.evolve(
        job, messages=[*job.messages, {"role": "assistant", "content": delivered}]
    )
    try:
        async with streamed.open(
            prefilled, exclude=frozenset({failed}), require_prefill=True
        ) as stream:
            async for chunk in stream:
                text = _content(chunk)
                if text is None:
                    continue
                await emit(
                    Chunk(_with_content(chunk, text, chunk_id) if chunk.get("choices") else chunk)
                )
            await emit(Ended(stream))
            return True
    except StreamInterrupted:
        return False  # a second break: fall through to the real failure
    except JobFailed:
        return False  # no prefill candidate, or it rejected the prefill: try regenerating


async def _regenerate(
    streamed: StreamJob, delivered: str, failed: str, chunk_id: str | None, emit: Emit
) -> bool:
    """(b): regenerate elsewhere and pass on only what exactly extends the delivered text."""
    produced, sent = "", len(delivered)
    try:
        async with streamed.open(exclude=frozenset({failed})) as stream:
            async for chunk in stream:
                text = _content(chunk)
                if text is None:
                    stream.discard("recovery: a chunk with no text to splice on")
                    return False
                if not chunk.get("choices"):
                    await emit(Chunk(chunk))  # usage
                    continue
                produced += text
                if not (produced.startswith(delivered) or delivered.startswith(produced)):
                    # it says something else: splicing it on would be a lie
                    stream.discard("recovery: it said something else than what was delivered")
                    return False
                if len(produced) > sent:
                    await emit(Chunk(_with_content(chunk, produced[sent:], chunk_id)))
                    sent = len(produced)
                elif chunk["choices"][0].get("finish_reason"):
                    await emit(Chunk(_with_content(chunk, "", chunk_id)))
            if len(produced) < len(delivered):
                return False
            await emit(Ended(stream))
            return True
    except JobFailed:
        return False

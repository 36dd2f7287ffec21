"""Server-sent events for `stream: true`, as a raw ASGI response.

The handler's own task runs the dispatcher's stream (with recovery,
`_core/engine/recovery.py`) and writes the headers and the first chunk itself, so the first byte
waits for no other task. Then a writer task takes over: the stream's chunks go to it through a
channel without a pause, and it sends everything that has arrived since its last write in one
write — under load, the chunks of several upstream events at once — and a keep-alive comment after
`keepalive_s` of silence. A client that goes away cancels everything — the upstream request
included — at once (`departures.py`, around every request).
Until the first chunk nothing is sent, so a failure before it is a proper HTTP error (429, 504…).
A stream broken after chunks ends with an in-band error event and never with `[DONE]`.

What the bytes look like is the API's own (`Dialect`): chat completions by default — each chunk
as the upstream wrote it, unless recovery rewrote it; the Responses and Messages APIs translate the
same chunks into their events (`_http/dialects.py`).
"""

from __future__ import annotations

import json
from collections.abc import MutableMapping
from typing import Any, Protocol

import trio

from lanes._core.dispatcher import Dispatcher
from lanes._core.engine.recovery import Broken, Chunk, Ended, Event, Failed, Started, relay
from lanes._core.engine.stream import AnswerStream
from lanes._core.freetier.prices import usd_text
from lanes._core.model.errors import JobFailed, StreamInterrupted
from lanes._core.model.job import Job
from lanes._core.model.statuses import http_status
from lanes._http.errors import PRIVATE_HEADERS, REQUEST_ID, error_body, job_failed

SSE = b"text/event-stream"
STREAM_HEADERS = [
    (b"cache-control", b"no-store"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-accel-buffering", b"no"),
]


def _event(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


class Dialect(Protocol):
    """How one API speaks a stream: its media type, what follows the headers, each chunk (given
    too as the upstream's own `data` when it is passed on unchanged), the end, an in-band error
    after chunks, a note or keep-alive that is no event (`comment`), and the HTTP error before
    any — and the header its SDK reads the request id from."""

    request_id_header: str
    media_type: bytes

    def opening(self, stream: AnswerStream) -> bytes: ...
    def chunk(self, data: dict[str, Any], raw: str | None = None) -> bytes: ...
    def ending(self, stream: AnswerStream) -> bytes: ...
    def broken(self, error: StreamInterrupted) -> bytes: ...
    def comment(self, text: str) -> bytes: ...
    def failed(self, exc: JobFailed) -> tuple[int, dict[str, Any], dict[str, str]]: ...


def cache_headers(status: str | None, age_s: float | None) -> list[tuple[bytes, bytes]]:
    """What the response cache did (`X-Lanes-Cache`, when it is on for the job), and a hit's
    `Age` in whole seconds."""
    if status is None:
        return []
    if age_s is None:
        return [(b"x-lanes-cache", status.encode())]
    return [(b"x-lanes-cache", status.encode()), (b"age", str(int(age_s)).encode())]


def sse_comment(text: str) -> bytes:
    """An SSE comment: read by no client as an event."""
    return b": " + text.encode() + b"\n\n"


class ChatDialect:
    """Chat completions: the chunks as they come — the upstream's own bytes when unchanged —
    `[DONE]` at the end, an OpenAI error event."""

    request_id_header = REQUEST_ID
    media_type = SSE

    def opening(self, stream: AnswerStream) -> bytes:
        return b""

    def chunk(self, data: dict[str, Any], raw: str | None = None) -> bytes:
        if raw is not None:
            return b"data: " + raw.encode() + b"\n\n"
        return _event(data)

    def ending(self, stream: AnswerStream) -> bytes:
        return b"data: [DONE]\n\n"

    def broken(self, error: StreamInterrupted) -> bytes:
        """OpenAI's in-band error: the provider's own status (as the error's type) and code when
        it said why in the stream, else a 502 `stream_interrupted`."""
        return _event(error_body(http_status(error), str(error), error.upstream_code or error.code))

    def comment(self, text: str) -> bytes:
        return sse_comment(text)

    def failed(self, exc: JobFailed) -> tuple[int, dict[str, Any], dict[str, str]]:
        return job_failed(exc)


class SSERelay:
    def __init__(
        self,
        dispatcher: Dispatcher,
        job: Job,
        *,
        keepalive_s: float,
        dialect: Dialect | None = None,
    ) -> None:
        self.dispatcher, self.job, self.keepalive_s = dispatcher, job, keepalive_s
        self.dialect: Dialect = dialect or ChatDialect()

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        to_writer, from_producer = trio.open_memory_channel[Event](64)
        head = _Head(self, send)
        async with trio.open_nursery() as nursery:

            async def write() -> None:
                await self._write(from_producer, send, head.pending)

            async def emit(event: Event) -> None:
                if head.done:  # the writer's: no pause per chunk, one write for what has come
                    try:
                        to_writer.send_nowait(event)
                    except trio.WouldBlock:  # the client reads slower than the upstream writes
                        await to_writer.send(event)
                elif await head.write(event):
                    nursery.start_soon(write)

            async with to_writer:
                await relay(self.dispatcher, self.job, emit)
            # the client has its answer; what the relay did since — reading the rest of the
            # upstream body, so its connection is kept — is done too. A writer ends by itself.

    async def _write(
        self,
        items: trio.MemoryReceiveChannel[Event],
        send: Any,
        pending: list[bytes],
    ) -> None:
        """Everything the head did not write (`pending`, then each event), until the stream is
        over."""
        while True:
            ended = await self._gather(items, pending)
            if ended:
                break
            if body := b"".join(pending):
                await send({"type": "http.response.body", "body": body, "more_body": True})
            pending.clear()
        await send({"type": "http.response.body", "body": b"".join(pending), "more_body": False})

    async def _gather(self, items: trio.MemoryReceiveChannel[Event], pending: list[bytes]) -> bool:
        """Add to `pending` the bytes of every event that has arrived — waiting for one if nothing
        is pending; a keep-alive after `keepalive_s` of silence. True when the stream is over."""
        if not any(pending):
            event: Event | None = None
            with trio.move_on_after(self.keepalive_s):
                try:
                    event = await items.receive()
                except trio.EndOfChannel:
                    return True
            if event is None:
                pending.append(self.dialect.comment("keep-alive"))
                return False
            if self._add(event, pending):
                return True
        while True:
            try:
                event = items.receive_nowait()
            except trio.WouldBlock:
                return False
            except trio.EndOfChannel:
                return True
            if self._add(event, pending):
                return True

    def _add(self, event: Event, pending: list[bytes]) -> bool:
        """The bytes of one event, added to `pending`; True when it ends the stream."""
        if isinstance(event, Chunk):
            pending.append(self.dialect.chunk(event.data, event.raw))
            return False
        if isinstance(event, Ended):
            last = event.stream
            cost = usd_text(last.job_cost_usd)
            note = f"lanes lane={last.lane} route={last.route} cost_usd={cost}"
            pending.append(self.dialect.comment(note) + self.dialect.ending(last))
            return True
        if isinstance(event, Broken):
            pending.append(self.dialect.broken(event.error))
            return True
        return False

    async def _error_response(self, send: Any, exc: JobFailed) -> None:
        status, body, headers = self.dialect.failed(exc)
        raw = json.dumps(body).encode()
        head = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
        head += [(k.lower().encode(), v.encode()) for k, v in PRIVATE_HEADERS.items()]
        head += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        await send({"type": "http.response.start", "status": status, "headers": head})
        await send({"type": "http.response.body", "body": raw, "more_body": False})


class _Head:
    """The start of a stream, written by the task that reads the upstream itself: the headers, then
    the chunks its first read brought, go out without waiting for another task's turn (under load,
    a turn is a round of every other stream's chunks); then a writer task takes over and batches
    the rest. A stream that fails, or ends, before that is answered here in full."""

    def __init__(self, relay: SSERelay, send: Any) -> None:
        self.relay, self.send = relay, send
        self.done = False  # nothing more is written here: a writer takes the rest, or it is over
        self.stream: AnswerStream | None = None  # the first candidate's, once the headers are out
        self.pending: list[bytes] = []

    async def write(self, event: Event) -> bool:
        """Write `event`; True when the writer must now take over."""
        relay, send = self.relay, self.send
        if isinstance(event, Failed):
            self.done = True
            await relay._error_response(send, event.error)
            return False
        if isinstance(event, Started):
            stream = self.stream = event.stream
            headers = [(b"content-type", relay.dialect.media_type), *STREAM_HEADERS] + [
                (b"x-lanes-request-id", stream.request_id.encode()),
                (relay.dialect.request_id_header.encode(), stream.request_id.encode()),
                (b"x-lanes-lane", stream.lane.encode()),
                (b"x-lanes-provider", stream.provider.encode()),
                (b"x-lanes-model", stream.model.encode()),
                (b"x-lanes-route", stream.route.encode()),
                (b"x-lanes-attempts", str(stream.attempt_count).encode()),
                *cache_headers(stream.cache, stream.age_s),
            ]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            self.pending.append(relay.dialect.opening(stream))
            if not stream.buffered:  # its first read held nothing to pass on (a usage chunk
                return self._hand_over()  # not asked for): the writer keeps the silence alive
            return False
        assert self.stream is not None, "a stream starts with its first candidate"
        if relay._add(event, self.pending):  # over already: a short answer, or broken
            self.done = True
            body = b"".join(self.pending)
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return False
        if self.stream.buffered:  # more of the same read follows at once: one write for all
            return False
        body = b"".join(self.pending)
        self.pending.clear()
        await send({"type": "http.response.body", "body": body, "more_body": True})
        return self._hand_over()

    def _hand_over(self) -> bool:
        """From now on the writer writes — what is still pending first."""
        self.done = True
        return True

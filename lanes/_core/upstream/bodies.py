"""An upstream's answer read in bounded pieces: a JSON body (`read_json`), a stream's chunks
(`ChunkReader`), and httpx2's errors while reading them as the tree's (`transport_error`).

No answer is ever read whole before it is measured: a body is read in pieces (decompressed in
pieces by httpx2) and reading stops at the caller's cap — `max_bytes` for a JSON answer, a catalog
or a balance (a fault, category `too_large`), `MAX_ERROR_BODY` for an error body (cut, which is
enough to classify it), `max_event_bytes` for one event of a stream (a fault). What is parsed is
strict JSON (`strictjson`): NaN, lone surrogates or absurd nesting from an upstream are garbage.
No function here takes a timeout: the caller's cancel scope bounds every await.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from typing import Any

import httpx2

from lanes._core.model import strictjson
from lanes._core.model.errors import RetryableError, UpstreamError
from lanes._core.model.untrusted import shown
from lanes._core.upstream.responses import MAX_DEPTH, in_band
from lanes._core.upstream.shapes import (
    ToolIndexes,
    in_band_error,
    normal_chunk,
    running_usage,
    usage_in,
)
from lanes._core.upstream.sse import SSEDecoder

MAX_ERROR_BODY = 64 * 1024
#: After a stream's `[DONE]`, what is left of its body (its end, normally on its way) is read for at
#: most this long and this much, so that the connection goes back to the pool instead of being
#: closed — the client has its answer by then; this only spares the next stream a new connection.
DRAIN_S = 0.5
DRAIN_BYTES = 64 * 1024


def _category(exc: httpx2.HTTPError) -> str:
    """`connect` (refused, DNS, TLS, connect timeout) and `reset` are the provider's, not a
    model's."""
    if isinstance(exc, (httpx2.ConnectError, httpx2.ConnectTimeout)):
        return "connect"
    if isinstance(exc, (httpx2.ReadError, httpx2.WriteError, httpx2.RemoteProtocolError)):
        return "reset"
    return "transport"


def transport_error(exc: httpx2.HTTPError, secrets: Iterable[str]) -> RetryableError:
    kind = type(exc).__name__
    detail = shown(str(exc), secrets, limit=200)
    return RetryableError(f"{kind}: {detail}" if detail else kind, category=_category(exc))


def too_large(what: str, limit: int) -> RetryableError:
    return RetryableError(f"{what} over {limit} bytes: not read further", category="too_large")


async def read_json(
    response: httpx2.Response, limit: int, secrets: Iterable[str], *, cut: bool = False
) -> bytes:
    """A body, read in pieces up to `limit` decoded bytes; beyond, `RetryableError` — or, `cut`
    (an error body, whose first bytes are enough to classify it), its first `limit` bytes."""
    declared = response.headers.get("content-length", "")
    if not cut and declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise too_large("answer", limit)
    parts: list[bytes] = []
    size = 0
    try:
        async for part in response.aiter_bytes():
            size += len(part)
            if size > limit and not cut:
                parts.clear()  # never held by the error's traceback, whatever keeps it
                raise too_large("answer", limit)
            parts.append(part)
            if cut and size >= limit:
                break
    except httpx2.HTTPError as exc:
        raise transport_error(exc, secrets) from exc
    return b"".join(parts)[:limit]


#: One event of a stream: the parsed chunk, and its `data` exactly as the upstream sent it (None
#: when it spanned several `data:` lines, so it can not be passed on as one line).
Received = tuple[dict[str, Any], str | None]


class ChunkReader:
    """Reads one upstream SSE stream. `receive()` is bounded only by the caller's cancel scope."""

    def __init__(
        self,
        response: httpx2.Response,
        secrets: Iterable[str],
        *,
        max_event_bytes: int = 1024 * 1024,
    ) -> None:
        self.headers = {k.lower(): v for k, v in response.headers.items()}
        self.finish_reason: str | None = None
        self.usage: Mapping[str, Any] | None = None
        self.malformed = 0  # chunks that were not JSON objects, skipped
        self.saw_done = False
        self._tool_indexes = ToolIndexes()
        self._bytes = response.aiter_bytes()
        self._max_event = max_event_bytes
        self._decoder = SSEDecoder(max_event_bytes=max_event_bytes)
        self._secrets = tuple(secrets)
        self._ended = False
        # said in the stream after chunks still to hand over
        self._error: UpstreamError | None = None

    async def receive(self) -> list[Received] | None:
        """Wait for the next bytes; return the chunks they completed, each with its `data` as sent
        ([] for a keep-alive).

        Returns None once the stream has ended properly: `[DONE]`, or end of body after a finish
        reason was seen. Raises `RetryableError` for a cut stream (closed with neither) or a
        transport error; an error the provider sends inside the stream raises the class its status
        says (`in_band` set), once the chunks before it have been returned.
        """
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        if self._ended:
            return None
        try:
            raw = await self._bytes.__anext__()
        except StopAsyncIteration:
            self._ended = True
            chunks = self._decode(self._decoder.close())
            if self.finish_reason is None and not self.saw_done:
                raise RetryableError(
                    "stream cut: closed without a finish reason", category="stream_cut"
                ) from None
            return chunks or None
        except httpx2.HTTPError as exc:
            self._ended = True
            raise RetryableError(
                f"stream cut: {transport_error(exc, self._secrets)}", category="stream_cut"
            ) from exc
        return self._decode(self._decoder.feed(raw))

    async def drain(self) -> None:
        """After `[DONE]`: read the rest of the body (at most `DRAIN_BYTES`), bounded only by the
        caller's scope; anything read is dropped. Nothing if the stream did not end that way."""
        if not self.saw_done:
            return
        size = 0
        with contextlib.suppress(httpx2.HTTPError):
            async for part in self._bytes:
                size += len(part)
                if size > DRAIN_BYTES:
                    return

    def _decode(self, events: list[str]) -> list[Received]:
        """The chunks `events` complete, up to `[DONE]`. Raises `RetryableError` for an oversized
        event; an error said in the stream as `receive()` says, after the chunks before it."""
        if self._decoder.oversized:
            self._ended = True
            raise too_large("a stream event", self._max_event)
        chunks: list[Received] = []
        for data in events:
            if self.saw_done:
                break
            if len(data) < 32 and data.strip() == "[DONE]":
                self.saw_done = self._ended = True
                break
            try:
                chunk = strictjson.loads(data, max_depth=MAX_DEPTH)
            except ValueError:
                self.malformed += 1
                continue
            if isinstance(chunk, dict) and (said := in_band_error(chunk)) is not None:
                self._ended = True  # the provider's last word; its status names the class
                exc = in_band(
                    *said,
                    chunk,
                    self.headers,
                    self._secrets,
                    where="stream",
                    category="stream_error",
                )
                if not chunks:
                    raise exc
                self._error = exc  # raised by the next receive(), after these chunks
                break
            if (received := self._received(chunk, data)) is not None:
                chunks.append(received)
        return chunks

    def _received(self, chunk: Any, data: str) -> Received | None:
        """`chunk` as handed on — with `data` when it can be passed on as sent, else rewritten
        (encoded again) — noting its finish reason and usage; None (malformed) if not one."""
        plain, finish = _plain_chunk(chunk)
        if plain:  # most chunks: text deltas, nothing to rewrite (one pass over the choices)
            normal = None
            if finish is not None:
                self.finish_reason = finish
        else:
            normal = normal_chunk(chunk) if isinstance(chunk, dict) else None
            if isinstance(chunk, dict):
                normal = self._tool_indexes.indexed(normal or chunk) or normal
            if not _chunk_shaped(normal or chunk):
                self.malformed += 1
                return None
            for choice in chunk.get("choices") or ():
                if isinstance(choice.get("finish_reason"), str) and choice["finish_reason"]:
                    self.finish_reason = choice["finish_reason"]
        if (usage := usage_in(chunk)) is not None:
            # a running total when it comes on every chunk: the last counts, never less
            self.usage = running_usage(self.usage, usage)
        if normal is not None:
            return normal, None
        return chunk, None if "\n" in data else data


def _plain_chunk(chunk: Any) -> tuple[bool, str | None]:
    """(True, its last finish reason or None) for a chunk that needs no rewriting and is shaped as
    `_chunk_shaped` asks — an object whose choices, if any, are objects whose delta, if any, has
    text or no `content` and no `tool_calls` — in one pass; (False, None) for any other (the
    full path then looks at it)."""
    if not isinstance(chunk, dict):
        return False, None
    choices = chunk.get("choices")
    if choices is None:
        return True, None
    if not isinstance(choices, list):
        return False, None
    finish = None
    for choice in choices:
        if not isinstance(choice, dict):
            return False, None
        delta = choice.get("delta")
        if delta is not None:
            if not isinstance(delta, dict) or "tool_calls" in delta:
                return False, None
            content = delta.get("content")
            if content is not None and not isinstance(content, str):
                return False, None
        reason = choice.get("finish_reason")
        if isinstance(reason, str) and reason:
            finish = reason
    return True, finish


def _chunk_shaped(chunk: Any) -> bool:
    """An object whose `choices`, if any, are objects whose `delta`, if any, is an object whose
    `content`, if any, is text: what the relay and stream recovery may read without checking."""
    if not isinstance(chunk, dict):
        return False
    choices = chunk.get("choices")
    if choices is None:
        return True
    if not isinstance(choices, list):
        return False
    for choice in choices:
        if not isinstance(choice, dict):
            return False
        delta = choice.get("delta")
        if delta is not None and not (
            isinstance(delta, dict) and isinstance(delta.get("content", ""), (str, type(None)))
        ):
            return False
    return True

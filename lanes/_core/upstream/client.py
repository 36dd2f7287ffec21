"""The OpenAI-compatible HTTP client every lane shares: one httpx2 pool, requests and SSE streams.

httpx2's own exceptions are translated here, once, into the tree in `errors.py`. No function here
takes a timeout: the caller's cancel scope (the job's deadline, the lane's cap) bounds every await,
and `trio.Cancelled` always passes through untouched.

No answer is ever read whole before it is measured: a body is read in pieces (decompressed in
pieces by httpx2) and reading stops at the caller's cap — `max_bytes` for a JSON answer, a catalog
or a balance (a fault, category `too_large`), `MAX_ERROR_BODY` for an error body (cut, which is
enough to classify it), `max_event_bytes` for one event of a stream (a fault). What is parsed is
strict JSON (`strictjson`): NaN, lone surrogates or absurd nesting from an upstream are garbage.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import attrs
import httpx2
import msgspec
import trio

from lanes._core.model import strictjson
from lanes._core.model.errors import FinalError, RetryableError, UpstreamError
from lanes._core.model.untrusted import MAX_CODE, shown
from lanes._core.upstream.responses import (
    MAX_DEPTH,
    check_completion,
    classify_status,
    in_band,
    parse_body,
)
from lanes._core.upstream.shapes import (
    ToolIndexes,
    in_band_error,
    normal_chunk,
    normal_completion,
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


@attrs.frozen(kw_only=True)
class Response:
    """A 2xx answer: status, headers (lower-case names) and the parsed completion."""

    status: int
    headers: Mapping[str, str]
    body: Mapping[str, Any]
    raw: bytes = b""  # the body's bytes exactly as the upstream sent them


_ENCODE = msgspec.json.Encoder().encode


def _category(exc: httpx2.HTTPError) -> str:
    """`connect` (refused, DNS, TLS, connect timeout) and `reset` are the provider's, not a
    model's."""
    if isinstance(exc, (httpx2.ConnectError, httpx2.ConnectTimeout)):
        return "connect"
    if isinstance(exc, (httpx2.ReadError, httpx2.WriteError, httpx2.RemoteProtocolError)):
        return "reset"
    return "transport"


def _transport_error(exc: httpx2.HTTPError, secrets: Iterable[str]) -> RetryableError:
    kind = type(exc).__name__
    detail = shown(str(exc), secrets, limit=200)
    return RetryableError(f"{kind}: {detail}" if detail else kind, category=_category(exc))


def encode(body: Mapping[str, Any], *, plain: bool = False) -> bytes:
    """The request body as strict JSON; `FinalError` (400) for what JSON can not carry (NaN,
    infinity, lone surrogates, objects): the request is at fault, so no other lane is tried.
    `plain`: the body holds only what strict JSON gave, and no float (`Job.plain`), so msgspec
    writes it byte for byte as `json.dumps` does, a tenth of the time (what it will not write,
    `json.dumps` tries, and says why)."""
    if plain:
        with contextlib.suppress(msgspec.MsgspecError, TypeError, ValueError, RecursionError):
            return _ENCODE(body)
    try:
        return json.dumps(body, allow_nan=False, ensure_ascii=False, separators=(",", ":")).encode()
    except (ValueError, TypeError, UnicodeEncodeError, RecursionError) as exc:
        raise FinalError(
            f"the request can not be encoded as JSON ({type(exc).__name__}: {str(exc)[:80]})",
            status=400,
            code="invalid_request",
            category="unencodable",
        ) from exc


def _json_headers(headers: Mapping[str, str]) -> dict[str, str]:
    # only what httpx2 decodes in bounded pieces; never an encoding we could not read
    return {**headers, "Content-Type": "application/json", "Accept-Encoding": "gzip, deflate"}


def _too_large(what: str, limit: int) -> RetryableError:
    return RetryableError(f"{what} over {limit} bytes: not read further", category="too_large")


async def _read_json(
    response: httpx2.Response, limit: int, secrets: Iterable[str], *, cut: bool = False
) -> bytes:
    """A body, read in pieces up to `limit` decoded bytes; beyond, `RetryableError` — or, `cut`
    (an error body, whose first bytes are enough to classify it), its first `limit` bytes."""
    declared = response.headers.get("content-length", "")
    if not cut and declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise _too_large("answer", limit)
    parts: list[bytes] = []
    size = 0
    try:
        async for part in response.aiter_bytes():
            size += len(part)
            if size > limit and not cut:
                parts.clear()  # never held by the error's traceback, whatever keeps it
                raise _too_large("answer", limit)
            parts.append(part)
            if cut and size >= limit:
                break
    except httpx2.HTTPError as exc:
        raise _transport_error(exc, secrets) from exc
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
                f"stream cut: {_transport_error(exc, self._secrets)}", category="stream_cut"
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
            raise _too_large("a stream event", self._max_event)
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


def _sent_trace(sent: Callable[[], None]) -> Callable[[str, Any], Awaitable[None]]:
    """A connection trace (httpcore's `trace` extension) that calls `sent` when a request's body
    has been written, over HTTP/1.1 or HTTP/2."""

    async def trace(event: str, info: Any) -> None:
        if event.endswith("send_request_body.complete"):
            sent()

    return trace


class Upstream:
    """One shared connection pool for every lane. Build it with `open_upstream()`.

    A completion (JSON or a stream) goes straight to the pool's transport: the client's layers
    above it — auth flows, redirects, a cookie jar shared by every lane and client, event hooks —
    are ones lanes never uses, and each request paid for them. What the client would add is kept:
    its default headers and its (absent) timeouts; the transport's errors are httpx2's own, so
    their classification is unchanged. Catalogs and balances still go through the client.
    """

    def __init__(
        self, client: httpx2.AsyncClient, transport: httpx2.AsyncBaseTransport | None = None
    ) -> None:
        self._client = client
        self._transport = transport
        self._defaults = {k.lower(): v for k, v in client.headers.items()}
        self._extensions = {"timeout": client.timeout.as_dict()}
        self._urls: dict[str, httpx2.URL] = {}  # parsed once per endpoint

    async def post_json(
        self,
        url: str,
        *,
        headers: Mapping[str, str],
        body: Mapping[str, Any] | bytes,
        secrets: Iterable[str] = (),
        check: Callable[[Any, Iterable[str]], Mapping[str, Any]] = check_completion,
        max_bytes: int = 8 * 1024 * 1024,
        sent: Callable[[], None] | None = None,
    ) -> Response:
        """POST a request (`body` encoded here, or as bytes already); return the parsed 2xx body
        (at most `max_bytes`: a usable completion, or what `check` accepts) or raise an
        `UpstreamError`. `sent` is called when the request's body has left (`_post`)."""
        async with self._post(url, headers, body, secrets, sent) as (response, lower):
            raw = await _read_json(response, max_bytes, secrets)
        try:
            completion = check(parse_body(raw), secrets)
        except UpstreamError as exc:
            exc.answered(status=response.status_code, headers=lower)
            raise
        normal = normal_completion(completion) if check is check_completion else None
        if normal is not None:  # typed content parts, read as chat: encoded again when passed on
            completion, raw = normal, b""
        return Response(status=response.status_code, headers=lower, body=completion, raw=raw)

    async def get_json(
        self,
        url: str,
        *,
        headers: Mapping[str, str],
        secrets: Iterable[str] = (),
        max_bytes: int = 8 * 1024 * 1024,
    ) -> Any:
        """GET a JSON document (a balance or catalog endpoint, at most `max_bytes`); raise an
        `UpstreamError` otherwise."""
        headers = {**headers, "Accept-Encoding": "gzip, deflate"}
        request = self._client.build_request("GET", url, headers=headers)
        async with self._exchange(request, secrets) as (response, _):
            return parse_body(await _read_json(response, max_bytes, secrets))

    @asynccontextmanager
    async def _post(
        self,
        url: str,
        headers: Mapping[str, str],
        body: Mapping[str, Any] | bytes,
        secrets: Iterable[str],
        sent: Callable[[], None] | None = None,
    ) -> AsyncIterator[tuple[httpx2.Response, dict[str, str]]]:
        """POST `body` as JSON (or its bytes as they are): `_exchange`. `sent`, if any, is called
        once the request is handed to the operating system whole (the connection made, TLS done,
        the body written to the socket: its buffers may still hold some of it), told by the
        connection's trace — never, through a transport that does not trace."""
        content = body if isinstance(body, bytes) else encode(body)
        extensions = (
            self._extensions if sent is None else {**self._extensions, "trace": _sent_trace(sent)}
        )
        if self._transport is None:
            request = self._client.build_request(
                "POST", url, content=content, headers=_json_headers(headers), extensions=extensions
            )
        else:
            merged = self._defaults | {k.lower(): v for k, v in _json_headers(headers).items()}
            request = httpx2.Request(
                "POST", self._url(url), content=content, headers=merged, extensions=extensions
            )
        async with self._exchange(request, secrets) as answer:
            yield answer

    def _url(self, url: str) -> httpx2.URL:
        parsed = self._urls.get(url)
        if parsed is None:
            if len(self._urls) >= 1024:  # endpoints are few; never let them grow without bound
                self._urls.clear()
            parsed = self._urls[url] = httpx2.URL(url)
        return parsed

    async def _send(self, request: httpx2.Request) -> httpx2.Response:
        if self._transport is None or request.method != "POST":
            return await self._client.send(request, stream=True)
        response = await self._transport.handle_async_request(request)
        response.request = request
        return response

    @asynccontextmanager
    async def _exchange(
        self, request: httpx2.Request, secrets: Iterable[str]
    ) -> AsyncIterator[tuple[httpx2.Response, dict[str, str]]]:
        """Send `request`; yield a 2xx response (its body left for the caller to read, in
        pieces) with its headers in lower case. A non-2xx answer is classified from its first
        bytes and raised."""
        try:
            response = await self._send(request)
        except httpx2.HTTPError as exc:
            raise _transport_error(exc, secrets) from exc
        try:
            lower = {k.lower(): v for k, v in response.headers.items()}
            if not 200 <= response.status_code < 300:
                raw = await _read_json(response, MAX_ERROR_BODY, secrets, cut=True)
                raise classify_status(response.status_code, lower, parse_body(raw), secrets=secrets)
            yield response, lower
        finally:
            with trio.CancelScope(shield=True):
                await response.aclose()

    @asynccontextmanager
    async def open_stream(
        self,
        url: str,
        *,
        headers: Mapping[str, str],
        body: Mapping[str, Any] | bytes,
        secrets: Iterable[str] = (),
        max_event_bytes: int = 1024 * 1024,
        sent: Callable[[], None] | None = None,
    ) -> AsyncIterator[ChunkReader]:
        """Open an SSE completion stream; a non-2xx answer raises before anything is yielded.
        `sent`: as `post_json`'s."""
        async with self._post(url, headers, body, secrets, sent) as (response, lower):
            content_type = lower.get("content-type", "").split(";")[0].strip().lower()
            if content_type != "text/event-stream":
                shown_type = shown(content_type, secrets, limit=MAX_CODE)
                raise RetryableError(
                    f"malformed stream: content-type {shown_type or 'missing'!r}",
                    category="malformed",
                )
            reader = ChunkReader(response, secrets, max_event_bytes=max_event_bytes)
            yield reader
            with trio.move_on_after(DRAIN_S):  # the stream ended well: keep its connection
                await reader.drain()


@asynccontextmanager
async def open_upstream(
    *, max_connections: int = 2048, transport: httpx2.AsyncBaseTransport | None = None
) -> AsyncIterator[Upstream]:
    """The shared pool: sized for many long streams; no timeouts of its own (the caller's scope).
    `transport` replaces the sockets (a replay's in-process providers)."""
    limits = httpx2.Limits(max_connections=max_connections, max_keepalive_connections=256)
    timeout = httpx2.Timeout(None)
    if transport is None:
        transport = httpx2.AsyncHTTPTransport(limits=limits, trust_env=False)
    async with httpx2.AsyncClient(transport=transport, timeout=timeout, trust_env=False) as client:
        yield Upstream(client, transport)

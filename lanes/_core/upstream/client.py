"""The OpenAI-compatible HTTP client every lane shares: one httpx2 pool, requests and SSE streams.

httpx2's own exceptions are translated into the tree in `errors.py` here and, while an answer is
read, in `bodies.py` (`transport_error`, which both use). No function here takes a timeout: the
caller's cancel scope (the job's deadline, the lane's cap) bounds every await, and
`trio.Cancelled` always passes through untouched.

No answer is ever read whole before it is measured: `bodies.py` reads each in bounded pieces.
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

from lanes._core.model.errors import FinalError, RetryableError, UpstreamError
from lanes._core.model.untrusted import MAX_CODE, shown
from lanes._core.upstream.bodies import (
    DRAIN_S,
    MAX_ERROR_BODY,
    ChunkReader,
    read_json,
    transport_error,
)
from lanes._core.upstream.responses import (
    check_completion,
    classify_status,
    parse_body,
)
from lanes._core.upstream.shapes import (
    normal_completion,
)


@attrs.frozen(kw_only=True)
class Response:
    """A 2xx answer: status, headers (lower-case names) and the parsed completion."""

    status: int
    headers: Mapping[str, str]
    body: Mapping[str, Any]
    raw: bytes = b""  # the body's bytes exactly as the upstream sent them


_ENCODE = msgspec.json.Encoder().encode


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
            raw = await read_json(response, max_bytes, secrets)
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
            return parse_body(await read_json(response, max_bytes, secrets))

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
            raise transport_error(exc, secrets) from exc
        try:
            lower = {k.lower(): v for k, v in response.headers.items()}
            if not 200 <= response.status_code < 300:
                raw = await read_json(response, MAX_ERROR_BODY, secrets, cut=True)
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

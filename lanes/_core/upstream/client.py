"""The OpenAI-compatible HTTP client every lane shares: one httpx2 pool, requests and SSE streams.

httpx2's own exceptions are translated here, once, into the tree in `errors.py`. No function here
takes a timeout: the caller's cancel scope (the job's deadline, the lane's cap) bounds every await,
and `trio.Cancelled` always passes through untouched.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import attrs
import httpx2
import trio

from lanes._core.errors import FinalError, RetryableError, UpstreamError
from lanes._core.upstream.responses import check_completion, classify_status, parse_body, redact
from lanes._core.upstream.sse import SSEDecoder

MAX_ERROR_BODY = 64 * 1024


@attrs.frozen(kw_only=True)
class Response:
    """A 2xx answer: status, headers (lower-case names) and the parsed completion."""

    status: int
    headers: Mapping[str, str]
    body: Mapping[str, Any]
    raw: bytes = b""  # the body's bytes exactly as the upstream sent them


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
    detail = redact(str(exc), secrets)[:200]
    return RetryableError(f"{kind}: {detail}" if detail else kind, category=_category(exc))


def encode(body: Mapping[str, Any]) -> bytes:
    """The request body as strict JSON; `FinalError` (400) for what JSON can not carry (NaN,
    infinity, lone surrogates, objects): the request is at fault, so no other lane is tried."""
    try:
        return json.dumps(body, allow_nan=False, ensure_ascii=False, separators=(",", ":")).encode()
    except (ValueError, TypeError, UnicodeEncodeError) as exc:
        raise FinalError(
            f"the request can not be encoded as JSON ({type(exc).__name__}: {str(exc)[:80]})",
            status=400,
            code="invalid_request",
            category="unencodable",
        ) from exc


def _json_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {**headers, "Content-Type": "application/json"}


class ChunkReader:
    """Reads one upstream SSE stream. `receive()` is bounded only by the caller's cancel scope."""

    def __init__(self, response: httpx2.Response, secrets: Iterable[str]) -> None:
        self.headers = {k.lower(): v for k, v in response.headers.items()}
        self.finish_reason: str | None = None
        self.usage: Mapping[str, Any] | None = None
        self.malformed = 0  # chunks that were not JSON objects, skipped
        self.saw_done = False
        self._bytes = response.aiter_bytes()
        self._decoder = SSEDecoder()
        self._secrets = tuple(secrets)
        self._ended = False

    async def receive(self) -> list[dict[str, Any]] | None:
        """Wait for the next bytes; return the chunks they completed ([] for a keep-alive).

        Returns None once the stream has ended properly: `[DONE]`, or end of body after a finish
        reason was seen. Raises `RetryableError` for a cut stream (closed with neither), a transport
        error or an error event inside the stream.
        """
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

    def _decode(self, events: list[str]) -> list[dict[str, Any]]:
        chunks = []
        for data in events:
            if self.saw_done:
                break
            if data.strip() == "[DONE]":
                self.saw_done = True
                self._ended = True
                break
            try:
                chunk = json.loads(data)
            except ValueError:
                self.malformed += 1
                continue
            if not isinstance(chunk, dict):
                self.malformed += 1
                continue
            if "error" in chunk and not chunk.get("choices"):
                self._ended = True
                error = classify_status(502, self.headers, chunk, secrets=self._secrets)
                raise RetryableError(f"error event in stream: {error}", category="stream_error")
            for choice in chunk.get("choices") or ():
                if isinstance(choice, dict) and choice.get("finish_reason"):
                    self.finish_reason = choice["finish_reason"]
            if chunk.get("usage"):
                self.usage = chunk["usage"]
            chunks.append(chunk)
        return chunks


class Upstream:
    """One shared connection pool for every lane. Build it with `open_upstream()`."""

    def __init__(self, client: httpx2.AsyncClient) -> None:
        self._client = client

    async def post_json(
        self,
        url: str,
        *,
        headers: Mapping[str, str],
        body: Mapping[str, Any],
        secrets: Iterable[str] = (),
        check: Callable[[Any], Mapping[str, Any]] = check_completion,
    ) -> Response:
        """POST a request; return the parsed 2xx body (a usable completion, or what `check`
        accepts) or raise an `UpstreamError`."""
        try:
            response = await self._client.post(
                url, content=encode(body), headers=_json_headers(headers)
            )
        except httpx2.HTTPError as exc:
            raise _transport_error(exc, secrets) from exc
        lower = {k.lower(): v for k, v in response.headers.items()}
        parsed = parse_body(response.content)
        if not 200 <= response.status_code < 300:
            raise classify_status(response.status_code, lower, parsed, secrets=secrets)
        try:
            completion = check(parsed)
        except UpstreamError as exc:
            exc.status, exc.headers = response.status_code, lower
            raise
        return Response(
            status=response.status_code, headers=lower, body=completion, raw=response.content
        )

    async def get_json(
        self, url: str, *, headers: Mapping[str, str], secrets: Iterable[str] = ()
    ) -> Any:
        """GET a JSON document (a balance or catalog endpoint); raise an `UpstreamError`
        otherwise."""
        try:
            response = await self._client.get(url, headers=dict(headers))
        except httpx2.HTTPError as exc:
            raise _transport_error(exc, secrets) from exc
        parsed = parse_body(response.content)
        if not 200 <= response.status_code < 300:
            raise classify_status(response.status_code, {}, parsed, secrets=secrets)
        return parsed

    @asynccontextmanager
    async def open_stream(
        self,
        url: str,
        *,
        headers: Mapping[str, str],
        body: Mapping[str, Any],
        secrets: Iterable[str] = (),
    ) -> AsyncIterator[ChunkReader]:
        """Open an SSE completion stream; a non-2xx answer raises before anything is yielded."""
        request = self._client.build_request(
            "POST", url, content=encode(body), headers=_json_headers(headers)
        )
        try:
            response = await self._client.send(request, stream=True)
        except httpx2.HTTPError as exc:
            raise _transport_error(exc, secrets) from exc
        try:
            lower = {k.lower(): v for k, v in response.headers.items()}
            if not 200 <= response.status_code < 300:
                raw = await _read_capped(response, secrets)
                raise classify_status(response.status_code, lower, parse_body(raw), secrets=secrets)
            content_type = lower.get("content-type", "").split(";")[0].strip().lower()
            if content_type != "text/event-stream":
                raise RetryableError(
                    f"malformed stream: content-type {content_type or 'missing'!r}",
                    category="malformed",
                )
            yield ChunkReader(response, secrets)
        finally:
            with trio.CancelScope(shield=True):
                await response.aclose()


async def _read_capped(response: httpx2.Response, secrets: Iterable[str]) -> bytes:
    parts, size = [], 0
    try:
        async for part in response.aiter_bytes():
            parts.append(part)
            size += len(part)
            if size >= MAX_ERROR_BODY:
                break
    except httpx2.HTTPError as exc:
        raise _transport_error(exc, secrets) from exc
    return b"".join(parts)


@asynccontextmanager
async def open_upstream(*, max_connections: int = 2048) -> AsyncIterator[Upstream]:
    """The shared pool: sized for many long streams; no timeouts of its own (the caller's scope)."""
    limits = httpx2.Limits(max_connections=max_connections, max_keepalive_connections=256)
    timeout = httpx2.Timeout(None)
    async with httpx2.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:
        yield Upstream(client)

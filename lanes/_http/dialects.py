"""The APIs translated onto chat-completion jobs, as the HTTP side needs them: how each reads a
request, answers, streams and fails. The translations themselves are pure, in
`lanes/_core/dialects/`; this module only fits them to the sidecar (ids, clocks, error shapes).

- `ChatCompletions` — `POST /v1/chat/completions` and every route not named below: OpenAI's
  error shape (a `Shape` only: chat completions need no translation);
- `ResponsesAPI` — `POST /v1/responses`: OpenAI's error shape; a stream of Responses events whose
  unrecoverable break is the in-band `error` event followed by `response.failed`.
- `MessagesAPI` — `POST /v1/messages`: the Messages API's own error shape (`rate_limit_error`,
  `overloaded_error`, …) and its `error` event; `x-api-key` is read as the client key.
- `GeminiAPI` — `/v1beta/models/…`: Google's error shape (`{"error": {"code", "message",
  "status"}}`, the status telling the client whether to retry, `RetryInfo` saying when), the
  client key also in `?key=`; `GeminiCall` is one request to it (the model and
  the method come from the path), streamed as `data:` events (`?alt=sse`) or one JSON array.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from starlette.requests import Request

from lanes._core.dialects import (
    gemini_api,
    gemini_reply,
    messages_api,
    messages_reply,
    responses_api,
    responses_reply,
    responses_stream,
)
from lanes._core.dialects.common import ChatRequest, compact, sse_event, written_once
from lanes._core.engine.stream import AnswerStream
from lanes._core.model.candidates import Reply
from lanes._core.model.errors import JobFailed, StreamInterrupted
from lanes._core.model.job import Job
from lanes._core.model.statuses import http_status
from lanes._http.errors import (
    MESSAGES_REQUEST_ID,
    MESSAGES_TYPES,
    REQUEST_ID,
    error_body,
    job_failed,
    messages_error_body,
)
from lanes._http.streaming import SSE, Dialect, sse_comment


class Shape(Protocol):
    """How an API's requests come in and its refusals and failures go out (`routes.py`)."""

    def incoming(self, request: Request) -> Request: ...
    def error_body(
        self, status: int, message: str, code: str | None, param: str | None
    ) -> dict[str, Any]: ...
    def failed(self, exc: JobFailed) -> tuple[int, dict[str, Any], dict[str, str]]: ...


class API(Shape, Protocol):
    """One API the sidecar translates onto chat-completion jobs; its SDK reads the request id from
    `request_id_header`."""

    request_id_header: str

    def to_chat(self, body: Mapping[str, Any]) -> ChatRequest: ...
    def answer(
        self, body: Mapping[str, Any], reply: Reply, job: Job, now: float
    ) -> dict[str, Any]: ...
    def rendered(self, answer: dict[str, Any]) -> bytes: ...
    def stream(self, body: Mapping[str, Any], job: Job, now: float) -> Dialect: ...


class ChatCompletions:
    """OpenAI's chat completions, and every route that speaks as they do."""

    def incoming(self, request: Request) -> Request:
        return request

    def error_body(
        self, status: int, message: str, code: str | None, param: str | None
    ) -> dict[str, Any]:
        return error_body(status, message, code, param)

    def failed(self, exc: JobFailed) -> tuple[int, dict[str, Any], dict[str, str]]:
        return job_failed(exc)


class _Events:
    """A stream `Dialect` over a pure translation that has `start`, `feed`, `finish` and an error
    of its own (`fail`, given the failure)."""

    def __init__(
        self,
        events: Any,
        fail: Callable[[StreamInterrupted], list[dict[str, Any]]],
        failed: Callable[[JobFailed], tuple[int, dict[str, Any], dict[str, str]]],
        request_id_header: str,
    ) -> None:
        self.request_id_header = request_id_header
        self.media_type = SSE
        self._events = events
        self._fail = fail
        self._failed = failed

    def opening(self, stream: AnswerStream) -> bytes:
        return b"".join(sse_event(e) for e in self._events.start())

    def chunk(self, data: dict[str, Any], raw: str | None = None) -> bytes:
        return b"".join(sse_event(e) for e in self._events.feed(data))

    def ending(self, stream: AnswerStream) -> bytes:
        # the usage the stream reported, also when it came in a chunk the caller did not ask for
        # (and so was not passed on as a chunk)
        return b"".join(sse_event(e) for e in self._events.finish(usage=stream.usage))

    def broken(self, error: StreamInterrupted) -> bytes:
        return b"".join(sse_event(e) for e in self._fail(error))

    def comment(self, text: str) -> bytes:
        return sse_comment(text)

    def failed(self, exc: JobFailed) -> tuple[int, dict[str, Any], dict[str, str]]:
        return self._failed(exc)


class ResponsesAPI(ChatCompletions):
    """`POST /v1/responses`: chat completions' requests and error shape."""

    request_id_header = REQUEST_ID

    def to_chat(self, body: Mapping[str, Any]) -> ChatRequest:
        return responses_api.to_chat(body)

    def answer(self, body: Mapping[str, Any], reply: Reply, job: Job, now: float) -> dict[str, Any]:
        return responses_reply.response_of(
            body, reply.body, response_id=f"resp_{job.id}", created_at=now
        )

    def rendered(self, answer: dict[str, Any]) -> bytes:
        """The answer's JSON, written by msgspec (`compact`): it echoes the request's tools, a
        sixth of an agent's 128 KB turn. It holds what the request's strict JSON held, text and
        whole numbers: never a NaN, which a JSON answer refuses."""
        return compact(answer)

    def stream(self, body: Mapping[str, Any], job: Job, now: float) -> Dialect:
        events = responses_stream.ResponseEvents(
            body,
            response_id=f"resp_{job.id}",
            created_at=now,
            model=job.model,
            written=written_once,
        )
        return _Events(
            events,
            lambda error: events.fail(
                error.upstream_code or error.code, str(error), status=http_status(error)
            ),
            self.failed,
            REQUEST_ID,
        )

    def failed(self, exc: JobFailed) -> tuple[int, dict[str, Any], dict[str, str]]:
        """The failure as chat completions says it, the field it names as this API calls it."""
        status, body, headers = job_failed(exc)
        param = body["error"]["param"]
        body["error"]["param"] = _RESPONSES_FIELDS.get(param, param)
        return status, body, headers


#: The Responses API's name for each chat-completion field an error can name.
_RESPONSES_FIELDS = {
    "max_tokens": "max_output_tokens",
    "max_completion_tokens": "max_output_tokens",
    "messages": "input",
    "response_format": "text.format",
}


class MessagesAPI:
    """`POST /v1/messages`."""

    request_id_header = MESSAGES_REQUEST_ID

    def incoming(self, request: Request) -> Request:
        """A request whose client key came in `x-api-key`, as this API's clients send it, with the
        key presented as a bearer token — so the one key check (`guard.py`, at the route's door,
        `routes.py`) reads it."""
        return _with_key(request, request.headers.get("x-api-key"))

    def to_chat(self, body: Mapping[str, Any]) -> ChatRequest:
        return messages_api.to_chat(body)

    def answer(self, body: Mapping[str, Any], reply: Reply, job: Job, now: float) -> dict[str, Any]:
        return messages_reply.message_of(reply.body, message_id=f"msg_{job.id}", model=job.model)

    def rendered(self, answer: dict[str, Any]) -> bytes:
        return json_answer(answer)  # a tool_use input may hold a NaN the upstream wrote

    def stream(self, body: Mapping[str, Any], job: Job, now: float) -> Dialect:
        events = messages_reply.MessageEvents(message_id=f"msg_{job.id}", model=job.model)
        return _Events(
            events,
            lambda error: events.fail(
                MESSAGES_TYPES.get(http_status(error), "api_error"), str(error)
            ),
            self.failed,
            MESSAGES_REQUEST_ID,
        )

    def error_body(
        self, status: int, message: str, code: str | None, param: str | None
    ) -> dict[str, Any]:
        return messages_error_body(status, message)

    def failed(self, exc: JobFailed) -> tuple[int, dict[str, Any], dict[str, str]]:
        status, body, headers = job_failed(exc, sdk_header=MESSAGES_REQUEST_ID)
        return (
            status,
            messages_error_body(status, body["error"]["message"], exc.request_id),
            headers,
        )


def json_answer(answer: dict[str, Any]) -> bytes:
    """An answer's JSON as a `JSONResponse` writes it (a NaN refused)."""
    return json.dumps(answer, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def _with_key(request: Request, key: str | None) -> Request:
    """`request` with `key` presented as a bearer token (unless it has one), so the one key check
    (`guard.py`, at the route's door, `routes.py`) reads it."""
    if key is None or "authorization" in request.headers:
        return request
    scope = dict(request.scope)
    scope["headers"] = [
        *request.scope["headers"],
        (b"authorization", b"Bearer " + key.strip().encode("latin-1", "replace")),
    ]
    return Request(scope, request.receive)


#: Gemini's name for each chat-completion field an error can name.
_GEMINI_FIELDS = {
    "max_tokens": "generationConfig.maxOutputTokens",
    "max_completion_tokens": "generationConfig.maxOutputTokens",
    "messages": "contents",
    "response_format": "generationConfig.responseMimeType",
    "tool_choice": "toolConfig",
}


class GeminiAPI:
    """`/v1beta/models/…`: Google's error shape and key."""

    request_id_header = REQUEST_ID

    def incoming(self, request: Request) -> Request:
        """The client key as Google's clients may send it in the URL, `?key=` (its header,
        `x-goog-api-key`, the guard reads on every route)."""
        return _with_key(request, request.query_params.get("key"))

    def error_body(
        self, status: int, message: str, code: str | None, param: str | None
    ) -> dict[str, Any]:
        field = _GEMINI_FIELDS.get(param, param) if param else None
        return gemini_reply.error_of(status, message, field=field, reason=code)

    def failed(self, exc: JobFailed) -> tuple[int, dict[str, Any], dict[str, str]]:
        """The failure in Google's shape: the field it names as Gemini calls it, and when to
        try again (`Retry-After` as `RetryInfo`)."""
        status, body, headers = job_failed(exc)
        error = body["error"]
        wait = headers.get("Retry-After")
        param = error["param"]
        approval = {k: error[k] for k in ("approval_id", "approval_url") if k in error}
        said = gemini_reply.error_of(
            status,
            error["message"],
            field=_GEMINI_FIELDS.get(param, param),
            reason=error["code"],
            metadata=approval,
            retry_after_s=int(wait) if wait is not None else None,
        )
        return status, said, headers


class GeminiCall(GeminiAPI):
    """One request to Gemini's API: the model and streaming its path names (`sse`: `?alt=sse`,
    else one JSON array)."""

    def __init__(self, *, model: str, stream: bool, sse: bool) -> None:
        self.model, self.streamed, self.sse = model, stream, sse

    def to_chat(self, body: Mapping[str, Any]) -> ChatRequest:
        return gemini_api.to_chat(body, model=self.model, stream=self.streamed)

    def answer(self, body: Mapping[str, Any], reply: Reply, job: Job, now: float) -> dict[str, Any]:
        return gemini_reply.response_of(
            reply.body, model=job.model, response_id=job.id, thoughts=gemini_api.thoughts(body)
        )

    def rendered(self, answer: dict[str, Any]) -> bytes:
        return json_answer(answer)

    def stream(self, body: Mapping[str, Any], job: Job, now: float) -> Dialect:
        chunks = gemini_reply.ResponseChunks(
            model=job.model, response_id=job.id, thoughts=gemini_api.thoughts(body)
        )
        return _GeminiStream(chunks, sse=self.sse, failed=self.failed)


class _GeminiStream:
    """A stream as Gemini's API sends one: `data: {response}` events (`?alt=sse`), or one JSON
    array written an element at a time. A note or keep-alive is a line break, never an SSE
    comment: Google's JavaScript SDK reads only `data:` lines from the start of what it holds,
    and a comment would stop it for good."""

    request_id_header = REQUEST_ID

    def __init__(
        self,
        chunks: gemini_reply.ResponseChunks,
        *,
        sse: bool,
        failed: Callable[[JobFailed], tuple[int, dict[str, Any], dict[str, str]]],
    ) -> None:
        self.media_type = SSE if sse else b"application/json"
        self.failed = failed
        self._chunks, self._sse = chunks, sse
        self._written = 0  # responses written (in an array, each after the first follows a comma)

    def _write(self, responses: list[dict[str, Any]]) -> bytes:
        out = []
        for said in responses:
            data = json.dumps(said, separators=(",", ":"), ensure_ascii=False).encode()
            if self._sse:
                out.append(b"data: " + data + b"\r\n\r\n")
            else:
                out.append((b",\r\n" if self._written else b"") + data)
            self._written += 1
        return b"".join(out)

    def opening(self, stream: AnswerStream) -> bytes:
        return b"" if self._sse else b"["

    def chunk(self, data: dict[str, Any], raw: str | None = None) -> bytes:
        return self._write(self._chunks.feed(data))

    def ending(self, stream: AnswerStream) -> bytes:
        return self._write(self._chunks.finish(usage=stream.usage)) + self._closing()

    def broken(self, error: StreamInterrupted) -> bytes:
        failure = self._chunks.fail(http_status(error), str(error))
        return self._write(failure) + self._closing()

    def comment(self, text: str) -> bytes:
        return b"\n"

    def _closing(self) -> bytes:
        return b"" if self._sse else b"]"

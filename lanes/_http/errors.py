"""The HTTP side of errors: every status, and the shapes errors travel in — OpenAI's
`{"error": {"message", "type", "code", "param"}}` everywhere, and on `/v1/messages` the Messages
API's own `{"type": "error", "error": {"type", "message"}}`."""

from __future__ import annotations

import math
from typing import Any

from starlette.responses import JSONResponse

from lanes._core.model.errors import (
    FallbackNeedsApproval,
    FreeTierExhausted,
    JobFailed,
    NoLaneAvailable,
    RetryLater,
    Unservable,
    UpstreamRejected,
)
from lanes._core.model.statuses import LATER, http_status

TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    421: "invalid_request_error",
    431: "invalid_request_error",
    429: "rate_limit_error",
    502: "api_error",
    503: "api_error",
    504: "timeout_error",
}


#: The Messages API's error type for each status (`api_error` for any other).
MESSAGES_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    415: "invalid_request_error",
    421: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


#: On every answer of the sidecar's routes and errors (`routes.serve`, `error_response`, a stream's
#: head): the views hold account data — no cache may keep it — and a JSON body is never sniffed
#: into something a browser would run.
PRIVATE_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}


class BadRequest(Exception):
    """A request refused before any routing: its status (400 unless said), code and field."""

    def __init__(
        self,
        message: str,
        param: str | None = None,
        status: int = 400,
        code: str = "invalid_request",
    ):
        super().__init__(message)
        self.param, self.status, self.code = param, status, code


def error_body(
    status: int, message: str, code: str | None, param: str | None = None
) -> dict[str, Any]:
    return {
        "error": {
            "message": _utf8(message),
            "type": TYPES.get(status, "api_error"),
            "code": _utf8(code),
            "param": _utf8(param),
        }
    }


def _utf8(text: str | None) -> str | None:
    """`text` as valid UTF-8: a lone surrogate echoed from a request would not encode."""
    if text is None or text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_response(
    status: int,
    message: str,
    code: str | None,
    *,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """An OpenAI-shaped error; a 429 or 503 always with `Retry-After` (1 s unless given); never
    cached or sniffed (`PRIVATE_HEADERS`)."""
    headers = PRIVATE_HEADERS | (headers or {})
    if status in LATER:
        headers.setdefault("Retry-After", retry_after(None))
    return JSONResponse(
        error_body(status, message, code, param), status_code=status, headers=headers
    )


def retry_after(seconds: float | None) -> str:
    """Whole seconds, rounded up, never 0."""
    return (
        str(max(1, math.ceil(seconds))) if seconds is not None and math.isfinite(seconds) else "1"
    )


#: Where the OpenAI SDK reads a response's request id (its `_request_id`); the Anthropic SDK, and
#: so `/v1/messages`, reads `MESSAGES_REQUEST_ID`.
REQUEST_ID = "x-request-id"
MESSAGES_REQUEST_ID = "request-id"


def request_id_headers(request_id: str, sdk_header: str = REQUEST_ID) -> dict[str, str]:
    """The job's id as `X-Lanes-Request-Id` and, the same id, where the client's SDK reads it."""
    return {"X-Lanes-Request-Id": request_id, sdk_header: request_id}


def job_failed(
    exc: JobFailed, *, approvals_url: str = "/", sdk_header: str = REQUEST_ID
) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, body, headers) for a job that ended without an answer; its id travels in
    `X-Lanes-Request-Id` and `sdk_header`."""
    status, code, headers = http_status(exc), exc.code, {"X-Lanes-Attempts": str(len(exc.attempts))}
    if exc.request_id:
        headers |= request_id_headers(exc.request_id, sdk_header)
    message = str(exc)
    if isinstance(exc, RetryLater):
        headers["Retry-After"] = retry_after(exc.retry_after_s)
    if isinstance(exc, FreeTierExhausted):
        if exc.next_eligible:
            headers["X-Lanes-Next-Eligible"] = exc.next_eligible
    elif isinstance(exc, FallbackNeedsApproval):
        headers["X-Lanes-Approval"] = exc.approval_id
        message = (
            f"{message}; approve it at {approvals_url} or POST /v1/approvals/{exc.approval_id}"
        )
    elif isinstance(exc, UpstreamRejected):
        code = exc.upstream_code or code
    elif (
        type(exc) is NoLaneAvailable
        and exc.attempts
        and all(a.category in ("malformed", "too_large") for a in exc.attempts)
    ):
        status, code = 502, "bad_upstream_response"
    if status in LATER:  # not now: when is known for a backoff, a quota, an approval; else 1 s
        headers.setdefault("Retry-After", retry_after(None))
    body = error_body(status, message, code, exc.param if isinstance(exc, Unservable) else None)
    if isinstance(exc, FallbackNeedsApproval):
        body["error"]["approval_id"] = exc.approval_id
        body["error"]["approval_url"] = approvals_url
    return status, body, headers


def messages_error_body(status: int, message: str, request_id: str | None = None) -> dict[str, Any]:
    """The Messages API's error shape for `status`."""
    body: dict[str, Any] = {
        "type": "error",
        "error": {"type": MESSAGES_TYPES.get(status, "api_error"), "message": message},
    }
    if request_id:
        body["request_id"] = request_id
    return body

"""One line of a batch, in and out, in OpenAI's Batch API format (pure).

In: `{"custom_id": "…", "method": "POST", "url": "/v1/chat/completions", "body": {…}}` — every
line of a file is read before anything runs, and a file with any bad line makes its batch
`failed` with OpenAI's `errors` list (the first `MAX_ERRORS`, 1-based line numbers). Out: a line
per item in the output file (`response.status_code` 200 and the upstream's body) or the error file
(an error status and body, or `error` for an item that never got an answer: expired, cancelled).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import attrs

from lanes._core.model import strictjson

ENDPOINTS = ("/v1/chat/completions", "/v1/embeddings", "/v1/responses")  # OpenAI's batches
MESSAGES = "/v1/messages"  # Anthropic's Message Batches: the same queue, its own lines
MAX_ERRORS = 100  # OpenAI lists at most this many bad lines
MAX_CUSTOM_ID = 512  # characters
WINDOW_MIN_S, WINDOW_MAX_S = 3600, 7 * 86400  # `completion_window`: 1h .. 7d
_WINDOW = re.compile(r"^([1-9][0-9]{0,5})([mhd])$")
_UNIT_S = {"m": 60, "h": 3600, "d": 86400}


@attrs.frozen
class LineError:
    """Why line `line` (1-based) of an input file can not run, in OpenAI's `errors` entry shape."""

    line: int
    code: str
    message: str
    param: str | None = None

    def entry(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "param": self.param, "line": self.line}


@attrs.frozen
class Line:
    """A good line: its `custom_id` and request body (the endpoint is the batch's)."""

    custom_id: str
    body: Mapping[str, Any]


def window_s(text: object) -> int:
    """`completion_window` in seconds: `24h` as OpenAI, and lanes' own from `1h` to `7d` (`90m`,
    `36h`, `3d`). Raises ValueError naming the range."""
    found = _WINDOW.match(text) if isinstance(text, str) else None
    seconds = int(found.group(1)) * _UNIT_S[found.group(2)] if found else 0
    if not WINDOW_MIN_S <= seconds <= WINDOW_MAX_S:
        raise ValueError(
            "completion_window must be a duration from 1h to 7d, as 24h (OpenAI's), 90m or 3d"
        )
    return seconds


def read_line(raw: bytes, number: int, endpoint: str, max_bytes: int) -> Line | LineError:
    """Line `number` of an input file for a batch on `endpoint`, or why it can not run."""

    def bad(code: str, message: str, param: str | None = None) -> LineError:
        return LineError(number, code, message, param)

    if len(raw) > max_bytes:
        return bad("request_too_large", f"the line is over the {max_bytes}-byte cap per line")
    try:
        value = strictjson.loads(raw)
    except (ValueError, RecursionError):
        return bad("invalid_json_line", "the line is not one JSON object")
    if not isinstance(value, dict):
        return bad("invalid_json_line", "the line is not one JSON object")
    custom_id = value.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > MAX_CUSTOM_ID:
        message = f"custom_id must be a non-empty string of at most {MAX_CUSTOM_ID} characters"
        return bad("missing_required_parameter", message, "custom_id")
    if value.get("method", "POST") != "POST":
        return bad("invalid_request", "method must be POST", "method")
    if value.get("url") != endpoint:
        return bad("mismatched_url", f"url must be the batch's endpoint, {endpoint}", "url")
    body = value.get("body")
    wrong = _body_wrong(body)
    if wrong is not None:
        return bad(*wrong)
    assert isinstance(body, dict)
    return Line(custom_id=custom_id, body=body)


def _body_wrong(body: object) -> tuple[str, str, str] | None:
    """(code, message, param) when a line's `body` can not be a batch item's request."""
    if not isinstance(body, dict):
        return "missing_required_parameter", "body must be a JSON object", "body"
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "missing_required_parameter", "body.model must name a model", "body.model"
    if body.get("stream"):
        return "invalid_request", "a batch item can not be streamed", "body.stream"
    return None


def output_line(item_id: str, custom_id: str, request_id: str, body: bytes) -> bytes:
    """A 200 answer's line of the output file; `body` is the upstream's own JSON bytes."""
    head = json.dumps({"id": item_id, "custom_id": custom_id})[:-1]
    response = f'{{"status_code": 200, "request_id": {json.dumps(request_id)}, "body": '
    return f'{head}, "response": {response}'.encode() + body + b'}, "error": null}\n'


def error_line(
    item_id: str,
    custom_id: str,
    *,
    status: int | None = None,
    request_id: str = "",
    body: Mapping[str, Any] | None = None,
    code: str = "",
    message: str = "",
) -> bytes:
    """A line of the error file: an answer with an error status (`status` and its `body`), or
    an item that got none (`code` and `message`: `batch_expired`, `batch_cancelled`)."""
    line: dict[str, Any] = {"id": item_id, "custom_id": custom_id, "response": None, "error": None}
    if status is not None:
        line["response"] = {"status_code": status, "request_id": request_id, "body": body or {}}
    else:
        line["error"] = {"code": code, "message": message}
    return json.dumps(line).encode() + b"\n"


def answered_line(
    endpoint: str, item_id: str, custom_id: str, request_id: str, body: bytes
) -> bytes:
    """A 200 answer's line in its batch's format: OpenAI's output line, or Anthropic's
    `succeeded` result (the Messages API answer as `message`)."""
    if endpoint != MESSAGES:
        return output_line(item_id, custom_id, request_id, body)
    head = json.dumps({"custom_id": custom_id})[:-1]
    return f'{head}, "result": {{"type": "succeeded", "message": '.encode() + body + b"}}\n"


def failed_line(
    endpoint: str, item_id: str, custom_id: str, status: int, request_id: str,
    body: Mapping[str, Any],
) -> bytes:  # fmt: skip
    """An error answer's line: OpenAI's error-file line, or Anthropic's `errored` result (the
    Messages API error body as `error`)."""
    if endpoint != MESSAGES:
        return error_line(item_id, custom_id, status=status, request_id=request_id, body=body)
    result = {"type": "errored", "error": dict(body)}
    return json.dumps({"custom_id": custom_id, "result": result}).encode() + b"\n"


def closed_line(endpoint: str, item_id: str, custom_id: str, why: str) -> bytes:
    """The line of an item that got no answer (`why`: expired or cancelled)."""
    if endpoint == MESSAGES:
        kind = "canceled" if why == "cancelled" else "expired"
        return json.dumps({"custom_id": custom_id, "result": {"type": kind}}).encode() + b"\n"
    code, message = CLOSED[why]
    return error_line(item_id, custom_id, code=code, message=message)


CLOSED = {
    "expired": (
        "batch_expired",
        "This request could not be executed before the completion window expired.",
    ),
    "cancelled": ("batch_cancelled", "This request was not executed: its batch was cancelled."),
}

"""Turn an upstream's HTTP answer into one class of the exception tree. Pure.

Retryable: 408, 425, 5xx, unknown 4xx, garbage. Final (the walk stops, nothing falls back): 400,
401, 403, 413, 422 — unless the body says the prompt did not fit, which is `ContextLengthExceeded`.
429 is `RateLimited` unless the body says credits ran out; 402 is `CreditExhausted`; 404 and
`model_not_found` are `ModelGone`.

An error object's words are read before its numbers: the code kept is its first text among `code`,
`type` and `status` (llama.cpp's `{"code": 400, "type": "exceed_context_size_error"}` keeps the
type), a bare number only when there is no word; and it is classified on all of them and the
message together. Messages keep the upstream's own error message and code, each passed through
`untrusted.shown` (bounded, without known secrets, control characters or anything key-shaped)
before it is kept anywhere — the exception's `code` too, which becomes the client's error `code`.

The context-overflow wordings are those of the hosted APIs and of the local servers' own source
(tests/corpus/local/SOURCES.md): llama.cpp's `exceed_context_size_error`, Ollama's "exceeds the
context length", vLLM's "context length is only", LM Studio's "context length of only".
"""

from __future__ import annotations

# lanes: pure
import re
from collections.abc import Iterable, Mapping
from typing import Any

from lanes._core.model import strictjson
from lanes._core.model.errors import (
    ContextLengthExceeded,
    CreditExhausted,
    FinalError,
    ModelGone,
    RateLimited,
    RetryableError,
    UpstreamError,
)
from lanes._core.model.untrusted import MAX_CODE, shown
from lanes._core.upstream.shapes import in_band_error

FINAL_STATUSES = frozenset({400, 401, 403, 413, 422})
_CONTEXT = re.compile(
    r"context[_ ]length|context window|maximum context|too many tokens|prompt is too long"
    r"|reduce the length|exceeds the model'?s? (max|context)"
    r"|exceed_context_size|(exceeds|larger than) the (available|max) context size",
    re.IGNORECASE,
)
_FIELDS = ("code", "type", "status")  # where an error object names itself
_CREDIT = re.compile(
    r"insufficient[_ ]quota|\bcredits?\b|\bbalance\b|billing|payment", re.IGNORECASE
)
_MODEL_GONE = re.compile(
    r"model[_ ]not[_ ]found|no such model|model .{0,80} does not exist", re.IGNORECASE
)
MAX_DEPTH = 128  # an answer nests a little deeper than a request (tool calls, logprobs)


def shown_error(message: str, code: str | None, secrets: Iterable[str]) -> tuple[str, str | None]:
    """An upstream error's (message, code), each as it may be shown (`untrusted.shown`); the code
    is None when there is none, or nothing of it may be shown."""
    return shown(message, secrets), (shown(code, secrets, limit=MAX_CODE) or None) if code else None


def error_fields(body: Any) -> tuple[str, str | None]:
    """(message, code) from an OpenAI-shaped error body, a bare string, or anything else; the code
    is the error's first word among `code`, `type`, `status`, else its first number."""
    message, names = _said(body)
    return message, _code(names)


def _code(names: list[str]) -> str | None:
    """The first word among an error's names, else its first number, else None."""
    words = [name for name in names if not name.isdigit()]
    return next(iter(words or names), None)


def _said(body: Any) -> tuple[str, list[str]]:
    """(message, the names the error gives itself in `_FIELDS` order, each as text)."""
    if isinstance(body, Mapping):
        error = body.get("error", body)
        if isinstance(error, Mapping):
            message = error.get("message")
            names = [error.get(key) for key in _FIELDS]
            return (str(message) if message is not None else ""), [
                str(name) for name in names if _is_name(name)
            ]
        if isinstance(error, str):
            return error, []
        return "", []
    if isinstance(body, list) and body:
        return _said(body[0])  # some upstreams wrap their error in a list
    if isinstance(body, (str, bytes)):
        return (body.decode("utf-8", "replace") if isinstance(body, bytes) else body), []
    return "", []


def _is_name(value: Any) -> bool:
    """A code, type or status worth keeping: non-empty text, or a number (never a bool)."""
    if isinstance(value, str):
        return bool(value.strip())
    return isinstance(value, int) and not isinstance(value, bool)


def parse_body(raw: bytes) -> Any:
    """The body as strict JSON when it parses as such (see `strictjson`), else as text."""
    try:
        return strictjson.loads(raw, max_depth=MAX_DEPTH)
    except ValueError:
        return raw.decode("utf-8", "replace")


def classify_status(
    status: int,
    headers: Mapping[str, str],
    body: Any,
    *,
    secrets: Iterable[str] = (),
) -> UpstreamError:
    """The exception for a non-2xx answer (returned, not raised: the caller raises it `from`)."""
    raw_message, names = _said(body)
    raw_code = _code(names)
    text = " ".join([*names, raw_message])  # read whole to classify, never shown
    message, code = shown_error(raw_message, raw_code, secrets)
    detail = f"HTTP {status}" + (f" {code}" if code else "") + (f": {message}" if message else "")
    kw = {"status": status, "headers": headers, "body": body, "code": code}
    if status == 429:
        cls = CreditExhausted if _CREDIT.search(text) else RateLimited
        return cls(detail, **kw)
    if status == 402:
        return CreditExhausted(detail, **kw)
    if status in (404, 410) or _MODEL_GONE.search(text) and 400 <= status < 500:
        return ModelGone(detail, **kw)
    if 400 <= status < 500 and _CONTEXT.search(text):
        return ContextLengthExceeded(detail, **kw)
    if status in FINAL_STATUSES:
        return FinalError(detail, **kw)
    return RetryableError(detail, category="server_error" if status >= 500 else "http_error", **kw)


def in_band(
    status: int,
    said: Mapping[str, Any],
    body: Any,
    headers: Mapping[str, str],
    secrets: Iterable[str] = (),
    *,
    where: str,
    category: str,
) -> UpstreamError:
    """The exception for an error a provider said inside a 200 `where` (a stream, a response):
    the class its own `status` says — a 429 is a rate limit, a 400 final — marked `in_band`, its
    body `body` as sent; a retryable one gets `category`."""
    exc = classify_status(status, headers, said, secrets=secrets)
    exc.said_in_band(where, body, category if type(exc) is RetryableError else None)
    return exc


def check_completion(body: Any, secrets: Iterable[str] = ()) -> Mapping[str, Any]:
    """A 2xx body that is a usable `chat.completion`, or `RetryableError` (garbage), or the
    error said inside the 200 (`in_band`: its message shown without `secrets`)."""
    completion = _check_object(body, "choices", secrets)
    choices = completion.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        raise RetryableError("malformed response: no choices", category="malformed")
    return completion


def check_embeddings(body: Any, secrets: Iterable[str] = ()) -> Mapping[str, Any]:
    """A 2xx body that is a usable embeddings `list` (each item's `embedding` a list of numbers or a
    base64 string), or `RetryableError` (garbage, or an error inside the 200)."""
    embeddings = _check_object(body, "data", secrets)
    data = embeddings.get("data")
    if not isinstance(data, list) or not data:
        raise RetryableError("malformed response: no embeddings", category="malformed")
    for item in data:
        vector = item.get("embedding") if isinstance(item, Mapping) else None
        if not isinstance(vector, (list, str)) or not vector:
            raise RetryableError(
                "malformed response: an item without an embedding", category="malformed"
            )
    return embeddings


def _check_object(body: Any, key: str, secrets: Iterable[str]) -> Mapping[str, Any]:
    """`RetryableError` for a 2xx body that is no JSON object, or an error without `key`."""
    if not isinstance(body, Mapping):
        raise RetryableError("malformed response: not a JSON object", category="malformed")
    if key not in body and (said := in_band_error(body)) is not None:
        raise in_band(*said, body, {}, secrets, where="response", category="error_in_200")
    if "error" in body and key not in body:
        message, code = shown_error(*error_fields(body), secrets)
        raise RetryableError(
            f"error inside a 200 response: {code or ''} {message}".strip(), category="error_in_200"
        )
    return body

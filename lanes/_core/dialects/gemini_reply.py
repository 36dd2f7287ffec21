"""Chat completions → Gemini's API: the `GenerateContentResponse` for an answer, one for each
piece of a stream, the error a stream ends with. Pure. The request's way in is `gemini_api.py`.

`response_of(...)`: one candidate, `role: "model"`, whose parts are the provider's reasoning (a
`thought: true` part, only when `thinkingConfig.includeThoughts` asked for it), the text, and a
`functionCall` (with its `id`, which the client sends back with the `functionResponse`, and
beside it the `thoughtSignature` of the call's `extra_content`, which Gemini 3 needs back) for
each tool call; its `finishReason` (`STOP`, `MAX_TOKENS`, `SAFETY`, `OTHER`) and the `usageMetadata`
(`candidatesTokenCount` without the thoughts, which are `thoughtsTokenCount`, as Gemini counts).
`modelVersion` is the model asked for (who served it is in `X-Lanes-Model`).

`ResponseChunks` does it for a stream, as Gemini streams: a response for each chunk's text, each
function call whole (Gemini never splits one's arguments), and the last with the finish reason and
the usage — or `fail(...)`'s `{"error": {"code", "message", "status"}}` when the answer broke.
"""

from __future__ import annotations

# lanes: pure
import json
from collections.abc import Mapping
from typing import Any

from lanes._core.dialects.common import (
    ChoiceReader,
    first_choice,
    text_of,
    token_counts,
    tool_calls_of,
)
from lanes._core.dialects.gemini_tools import thought_signature
from lanes._core.upstream.shapes import reasoning_of, usage_in

FINISH_REASONS = {
    "stop": "STOP",
    "length": "MAX_TOKENS",
    "tool_calls": "STOP",  # Gemini ends a turn that calls functions with STOP
    "function_call": "STOP",
    "content_filter": "SAFETY",
}

#: google.rpc's status for each HTTP status: the client retries `RESOURCE_EXHAUSTED`,
#: `UNAVAILABLE`, `INTERNAL` and `DEADLINE_EXCEEDED`, and fixes the request on the others.
STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    415: "INVALID_ARGUMENT",
    421: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    431: "INVALID_ARGUMENT",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def error_of(
    status: int,
    message: str,
    *,
    field: str | None = None,
    reason: str | None = None,
    metadata: Mapping[str, str] | None = None,
    retry_after_s: int | None = None,
) -> dict[str, Any]:
    """Google's error shape for `status`: lanes' error code (`reason`: `free_tier_exhausted`, …)
    as an `ErrorInfo` (with `metadata`: an approval's id and where to give it), a bad `field` as
    a `BadRequest` field violation, a wait as `RetryInfo` (what Google's clients read before
    retrying)."""
    error: dict[str, Any] = {
        "code": status,
        "message": message,
        "status": STATUSES.get(status, "INTERNAL" if status >= 500 else "FAILED_PRECONDITION"),
    }
    details: list[dict[str, Any]] = []
    if reason:
        info = {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason.upper()}
        details.append(
            info | {"domain": "lanes", **({"metadata": dict(metadata)} if metadata else {})}
        )
    if field:
        violation = {"field": field, "description": message}
        details.append(
            {"@type": "type.googleapis.com/google.rpc.BadRequest", "fieldViolations": [violation]}
        )
    if retry_after_s is not None:
        details.append(
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": f"{retry_after_s}s"}
        )
    if details:
        error["details"] = details
    return {"error": error}


def usage_of(usage: Any) -> dict[str, int]:
    """Gemini's `usageMetadata` for a chat `usage`."""
    prompt, completion, cached, reasoning = token_counts(usage)
    reasoning = min(reasoning, completion)
    said = {
        "promptTokenCount": prompt,
        "candidatesTokenCount": completion - reasoning,
        "totalTokenCount": prompt + completion,
    }
    if reasoning:
        said["thoughtsTokenCount"] = reasoning
    if cached:
        said["cachedContentTokenCount"] = cached
    return said


def args_of(arguments: str) -> dict[str, Any]:
    """A tool call's arguments as the object a `functionCall` carries."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {"arguments": arguments}  # not JSON: kept whole rather than lost
    return value if isinstance(value, dict) else {"value": value}


def _call(call_id: str, name: str, arguments: str, extra: Any) -> dict[str, Any]:
    """The part of a function call (`extra`: the chat call's `extra_content`)."""
    call = {"id": call_id, "name": name, "args": args_of(arguments)}
    part: dict[str, Any] = {"functionCall": call}
    if signature := thought_signature(extra):
        part["thoughtSignature"] = signature
    return part


def response(
    parts: list[dict[str, Any]],
    *,
    model: str,
    response_id: str,
    finish_reason: str | None = None,
    usage: dict[str, int] | None = None,
) -> dict[str, Any]:
    """One `GenerateContentResponse` of one candidate (a stream's last one has the finish reason
    and the usage)."""
    candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}, "index": 0}
    if finish_reason is not None:
        candidate["finishReason"] = finish_reason
    said: dict[str, Any] = {"candidates": [candidate]}
    if usage is not None:
        said["usageMetadata"] = usage
    return said | {"modelVersion": model, "responseId": response_id}


def response_of(
    completion: Mapping[str, Any], *, model: str, response_id: str, thoughts: bool = False
) -> dict[str, Any]:
    """The `GenerateContentResponse` for a chat completion (`thoughts`: the reasoning too)."""
    message, finish_reason = first_choice(completion)
    parts: list[dict[str, Any]] = []
    if thoughts and (thinking := reasoning_of(message)):
        parts.append({"text": thinking, "thought": True})
    if text := text_of(message.get("content")) or text_of(message.get("refusal")):
        parts.append({"text": text})
    for k, (call_id, name, arguments, extra) in enumerate(tool_calls_of(message)):
        parts.append(_call(call_id or f"call_{response_id}_{k}", name, arguments, extra))
    return response(
        parts,
        model=model,
        response_id=response_id,
        finish_reason=FINISH_REASONS.get(finish_reason or "stop", "OTHER"),
        usage=usage_of(usage_in(completion)),
    )


class ResponseChunks:
    """Chat completion chunks in, Gemini's streamed `GenerateContentResponse`s out (sans-io).

    `feed(chunk)` for each chunk, then `finish()` — or `fail(status, message)`.
    """

    def __init__(self, *, model: str, response_id: str, thoughts: bool = False) -> None:
        self._model, self._id, self._thoughts = model, response_id, thoughts
        self._reader = ChoiceReader()
        self._calls: dict[int, list[Any]] = {}  # chat index → [id, name, arguments, extra]

    def _response(self, parts: list[dict[str, Any]], **last: Any) -> dict[str, Any]:
        return response(parts, model=self._model, response_id=self._id, **last)

    def feed(self, chunk: Mapping[str, Any]) -> list[dict[str, Any]]:
        parts: list[dict[str, Any]] = []
        for kind, value in self._reader.read(chunk):
            if kind == "text":
                parts.append({"text": value})
            elif kind == "thinking" and self._thoughts:
                parts.append({"text": value, "thought": True})
            elif kind == "tool":
                index, call_id, name, arguments, extra = value
                call = self._calls.setdefault(index, ["", "", "", None])
                call[0], call[1] = call[0] or call_id or "", call[1] or name or ""
                call[2] += arguments
                call[3] = call[3] or extra
        return [self._response(_merged(parts))] if parts else []

    def finish(self, *, usage: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """The last response: the function calls, whole, the finish reason and the usage (`usage`
        counts when no chunk fed in carried one)."""
        parts = [
            _call(call_id or f"call_{self._id}_{index}", name, arguments, extra)
            for index, (call_id, name, arguments, extra) in sorted(self._calls.items())
        ]
        reason = FINISH_REASONS.get(self._reader.finish_reason or "stop", "OTHER")
        said = usage_of(self._reader.usage or usage)
        return [self._response(parts, finish_reason=reason, usage=said)]

    def fail(self, status: int, message: str) -> list[dict[str, Any]]:
        """The error a broken stream ends with, as Google's API ends one."""
        return [error_of(status, message)]


def _merged(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Adjacent text pieces of one kind (thought or not) as one part."""
    out: list[dict[str, Any]] = []
    for part in parts:
        if out and out[-1].get("thought") == part.get("thought"):
            out[-1] = {**out[-1], "text": out[-1]["text"] + part["text"]}
        else:
            out.append(part)
    return out


#: What lanes serves on every model it lists.
METHODS = ["generateContent", "streamGenerateContent", "countTokens"]


def model_of(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A `Model` as Gemini's API describes one, for an entry of lanes' model list."""
    model_id = str(entry["id"])
    said: dict[str, Any] = {
        "name": f"models/{model_id}",
        "baseModelId": model_id,
        "version": "lanes",
        "displayName": model_id,
        "description": f"served by lanes ({entry.get('tier', 'model')})",
        "supportedGenerationMethods": METHODS,
    }
    if isinstance(entry.get("context_length"), int):
        said["inputTokenLimit"] = entry["context_length"]
    return said

"""A chat completion → the Messages API's answer (`POST /v1/messages`, as Claude clients read it).
Pure.

`message_of(...)` turns the chat completion back into a `message` (a `thinking` block for the
provider's reasoning, text and `tool_use` blocks, `stop_reason`, usage); `MessageEvents` does it
for a stream: `message_start`, `content_block_start` / `_delta` (`thinking_delta` then a
`signature_delta`, `text_delta`, `input_json_delta`) / `_stop`, `message_delta`, `message_stop` —
or an `error` event when the answer broke. A tool call's `extra_content` rides in the `tool_use`
id the client is given (`call_ids.py`). The request's way in is `messages_api.py`.
"""

from __future__ import annotations

# lanes: pure
import json
from collections.abc import Mapping
from typing import Any

from lanes._core.dialects.call_ids import minted
from lanes._core.dialects.common import (
    ChoiceReader,
    first_choice,
    text_of,
    token_counts,
    tool_calls_of,
)
from lanes._core.upstream.shapes import reasoning_of, usage_in

#: What a block of each kind starts with besides its text: a thinking block carries a signature,
#: empty here (lanes has none to give, and reads none back).
_SIGNED: dict[str, dict[str, str]] = {"thinking": {"signature": ""}}
STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


def _stop_reason(finish_reason: str | None, *, called: bool) -> str:
    """The `stop_reason` of a chat finish reason. An answer holding a tool call is `tool_use`
    when the provider said only `stop` (as Gemini does), so the client runs the tool."""
    if called and finish_reason in (None, "stop"):
        return "tool_use"
    return STOP_REASONS.get(finish_reason or "stop", "end_turn")


# -- chat completion → message ---------------------------------------------------------------------


def usage_of(usage: Any) -> dict[str, int]:
    prompt, completion, cached, _ = token_counts(usage)
    return {
        "input_tokens": prompt - cached,
        "output_tokens": completion,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


def _input(arguments: str) -> dict[str, Any]:
    """A tool call's arguments as the object a `tool_use` block carries."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {"arguments": arguments}  # not JSON: kept whole rather than lost
    return value if isinstance(value, dict) else {"value": value}


def message_of(completion: Mapping[str, Any], *, message_id: str, model: str) -> dict[str, Any]:
    """The `message` for a chat completion. Its `model` is the one asked for (Claude clients
    choose behaviour by that name; who served it is in `X-Lanes-Model`), as in a stream."""
    message, finish_reason = first_choice(completion)
    content: list[dict[str, Any]] = []
    if thinking := reasoning_of(message):  # no signature: lanes reads none back, and has none
        content.append({"type": "thinking", "thinking": thinking, "signature": ""})
    text = text_of(message.get("content")) or text_of(message.get("refusal"))
    if text:
        content.append({"type": "text", "text": text})
    for call_id, name, arguments, extra in tool_calls_of(message):
        block_id = minted(call_id or f"toolu_{message_id}_{len(content)}", extra)
        content.append(
            {"type": "tool_use", "id": block_id, "name": name, "input": _input(arguments)}
        )
    if not content:
        content.append({"type": "text", "text": ""})
    called = any(b["type"] == "tool_use" for b in content)
    reason = _stop_reason(finish_reason, called=called)
    return _message(message_id, model, content, reason, usage_of(usage_in(completion)))


def _message(
    message_id: str, model: str, content: list[dict[str, Any]], reason: str | None, usage: Any
) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": None,
        "usage": usage,
    }


# -- a stream --------------------------------------------------------------------------------------


class MessageEvents:
    """Chat completion chunks in, Messages API stream events out (sans-io).

    `start()`, `feed(chunk)` for each chunk, then `finish()` — or `fail(type, message)`.
    """

    def __init__(self, *, message_id: str, model: str) -> None:
        self._id = message_id
        self._model = model
        self._reader = ChoiceReader()
        self._blocks = 0  # content blocks started so far
        self._open: str | None = None  # "text", or "tool:<chat index>" for the open block
        self._called = False  # a tool_use block was started

    def start(self) -> list[dict[str, Any]]:
        message = _message(self._id, self._model, [], None, usage_of(None))
        return [{"type": "message_start", "message": message}, {"type": "ping"}]

    def feed(self, chunk: Mapping[str, Any]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for kind, value in self._reader.read(chunk):
            if kind in ("text", "thinking"):
                if self._open != kind:
                    events += self._begin(kind, {"type": kind, kind: "", **_SIGNED.get(kind, {})})
                events.append(self._delta({"type": f"{kind}_delta", kind: value}))
                continue
            index, call_id, name, arguments, extra = value
            if self._open != f"tool:{index}":
                block: dict[str, Any] = {
                    "type": "tool_use",
                    "id": minted(call_id or f"toolu_{self._id}_{self._blocks}", extra),
                    "name": name or "",
                    "input": {},
                }
                events += self._begin(f"tool:{index}", block)
                self._called = True
            if arguments:
                events.append(self._delta({"type": "input_json_delta", "partial_json": arguments}))
        return events

    def _delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        """A delta to the open block (the last one started)."""
        return {"type": "content_block_delta", "index": self._blocks - 1, "delta": delta}

    def _begin(self, which: str, block: dict[str, Any]) -> list[dict[str, Any]]:
        events = self._close()
        events.append(
            {"type": "content_block_start", "index": self._blocks, "content_block": block}
        )
        self._blocks += 1
        self._open = which
        return events

    def _close(self) -> list[dict[str, Any]]:
        if self._open is None:
            return []
        events = []
        if self._open == "thinking":  # a thinking block ends with its signature, as Claude's do
            events.append(self._delta({"type": "signature_delta", "signature": ""}))
        self._open = None
        return [*events, {"type": "content_block_stop", "index": self._blocks - 1}]

    def finish(self, *, usage: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """The last events; `usage` counts when no chunk fed in carried one (the stream's usage
        can come in a chunk that is not passed on)."""
        events = self._close()
        if self._blocks == 0:  # an empty answer still has its (empty) text block
            events += self._begin("text", {"type": "text", "text": ""}) + self._close()
        reason = _stop_reason(self._reader.finish_reason, called=self._called)
        said = usage_of(self._reader.usage or usage)
        delta = {"stop_reason": reason, "stop_sequence": None}
        return [
            *events,
            {"type": "message_delta", "delta": delta, "usage": said},
            {"type": "message_stop"},
        ]

    def fail(self, error_type: str, message: str) -> list[dict[str, Any]]:
        """The in-band `error` event: the answer broke and could not be recovered."""
        return [{"type": "error", "error": {"type": error_type, "message": message}}]

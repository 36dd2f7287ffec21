"""What real providers send, read one way: typed content parts, reasoning, usage wherever it is put,
and an error inside a 200 stream. Pure.

- **Typed content parts.** Some providers answer with `content` as a list of parts —
  `[{"type": "text", "text": "…"}]`, and thinking parts
  `{"type": "thinking", "thinking": [{"type": "text", "text": "…"}]}` — in a whole message and in a
  stream delta alike. `normal_message` / `normal_chunk` turn them into what an OpenAI-style client
  reads: the text as the `content` string, the thinking as `reasoning_content`. Both paths use the
  same function, so a streamed answer and a whole one never disagree.
- **Tool calls without an `index`.** Gemini streams each call whole in a delta of its own with no
  `index` (an id that may be empty), where the OpenAI contract numbers them: `ToolIndexes` gives
  each delta the index of its call — a delta naming a call not seen yet starts the next one, one
  that names none continues the last — so clients (and the translations to Messages and
  Responses) never glue two calls' arguments together.
- **Reasoning** arrives as `reasoning_content`, `reasoning` or `reasoning_details` (a list of
  `reasoning.text` / `reasoning.summary` items; several providers send `reasoning` and
  `reasoning_details` with the same text, so only the first field present is read):
  `reasoning_of`.
- **Usage** is the top-level `usage`, else the `usage` inside a vendor extension object (a top-level
  `x_<vendor>` key), as some providers send it in streams: `usage_in`. A stream that repeats it on
  every chunk repeats a running total, so the caller keeps the last one and never adds them up —
  but a count that falls from one report to the next is no running total: the larger stands
  (`running_usage`), so a last chunk saying `0` never settles a paid stream at nothing.
- **An error inside a 200** — a chunk with an `error` object, with or without `choices` — keeps the
  status the provider gave it (`status_code`, or a numeric `code` / `status`): `in_band_error`.
"""

from __future__ import annotations

# lanes: pure
from collections.abc import Callable, Mapping
from typing import Any

#: The status of an in-band error that names none: the upstream failed, as a gateway says it.
UNSTATED_STATUS = 502
#: A code some providers give in-band errors in place of a status, and the status it stands for.
_CODE_STATUS = {
    "rate_limit_exceeded": 429,
    "rate_limited": 429,
    "too_many_requests": 429,
    "insufficient_quota": 429,
    "invalid_request_error": 400,
    "invalid_request": 400,
    "context_length_exceeded": 400,
    "server_error": 502,
    "overloaded_error": 503,
}
_TEXT_PARTS = ("text", "output_text")
_REASONING_ITEMS = ("reasoning.text", "reasoning.summary")  # of `reasoning_details`


def _texts(parts: Any) -> str:
    """The text of a list of text parts (or a bare string)."""
    if isinstance(parts, str):
        return parts
    if not isinstance(parts, list):
        return ""
    return "".join(
        part["text"]
        for part in parts
        if isinstance(part, Mapping)
        and part.get("type", "text") in _TEXT_PARTS
        and isinstance(part.get("text"), str)
    )


def split_parts(parts: list[Any]) -> tuple[str | None, str]:
    """(the text of the text parts — None when there are none —, the text of the thinking parts).
    Parts of any other type (images, references) carry no text and are left out."""
    texts: list[str] = []
    thinking: list[str] = []
    for part in parts:
        if not isinstance(part, Mapping):
            continue
        kind = part.get("type")
        if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "thinking":
            thinking.append(_texts(part.get("thinking")))
    return ("".join(texts) if texts else None), "".join(thinking)


def normal_message(message: Any) -> dict[str, Any] | None:
    """`message` (a chat message or a stream delta) with list `content` read as its text, and its
    thinking parts added to `reasoning_content`; None when there is nothing to change."""
    if not isinstance(message, Mapping) or not isinstance(message.get("content"), list):
        return None
    text, thinking = split_parts(message["content"])
    out = dict(message)
    out["content"] = text
    if thinking:
        before = out.get("reasoning_content")
        out["reasoning_content"] = (before if isinstance(before, str) else "") + thinking
    return out


def each_choice(
    body: Mapping[str, Any], change: Callable[[Mapping[str, Any]], dict[str, Any] | None]
) -> dict[str, Any] | None:
    """`body` with each choice that `change` changes replaced (`change` answers None for a choice
    it leaves as it was); None when it changed none."""
    choices = body.get("choices")
    if not isinstance(choices, list):
        return None
    out = [(change(c) if isinstance(c, Mapping) else None) or c for c in choices]
    changed = any(new is not old for new, old in zip(out, choices, strict=True))
    return {**body, "choices": out} if changed else None


def normal_choices(body: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    """`body` with each choice's `key` (`message` or `delta`) normalised; None when none changed."""

    def normalised(choice: Mapping[str, Any]) -> dict[str, Any] | None:
        normal = normal_message(choice.get(key))
        return None if normal is None else {**choice, key: normal}

    return each_choice(body, normalised)


def normal_chunk(chunk: Mapping[str, Any]) -> dict[str, Any] | None:
    """A `chat.completion.chunk` whose deltas carry typed parts, as plain chat (None: as it was)."""
    return normal_choices(chunk, "delta")


def normal_completion(completion: Mapping[str, Any]) -> dict[str, Any] | None:
    """A `chat.completion` whose messages carry typed parts, as plain chat; None if unchanged."""
    return normal_choices(completion, "message")


class ToolIndexes:
    """The `index` of each streamed tool-call delta, for one stream (see the module docstring).
    Its state is one small record per choice: a stream's own indexes are never used to size
    anything."""

    def __init__(self) -> None:
        self._calls: dict[Any, _Calls] = {}  # per choice index

    def indexed(self, chunk: Mapping[str, Any]) -> dict[str, Any] | None:
        """`chunk` with an `index` on each tool-call delta that had none; None when none lacked
        one."""
        return each_choice(chunk, self._numbered)

    def _numbered(self, choice: Mapping[str, Any]) -> dict[str, Any] | None:
        delta = choice.get("delta")
        if not isinstance(delta, Mapping) or not isinstance(delta.get("tool_calls"), list):
            return None
        calls = delta["tool_calls"]
        key = choice.get("index", 0)
        seen = self._calls.setdefault(key if isinstance(key, (int, str)) else 0, _Calls())
        numbered = [seen.numbered(call) for call in calls]
        if all(new is old for new, old in zip(numbered, calls, strict=True)):
            return None
        return {**choice, "delta": {**delta, "tool_calls": numbered}}


class _Calls:
    """The tool calls of one choice so far: how many, the last one's index, each id's index."""

    def __init__(self) -> None:
        self.count = 0
        self.last = -1
        self.by_id: dict[str, int] = {}

    def numbered(self, call: Any) -> Any:
        if not isinstance(call, Mapping):
            return call
        call_id = call.get("id") if isinstance(call.get("id"), str) and call["id"] else None
        index = call.get("index")
        if isinstance(index, int) and not isinstance(index, bool):
            self.count, self.last = max(self.count, index + 1), index
            if call_id is not None:
                self.by_id.setdefault(call_id, index)
            return call
        function = call.get("function")
        named = isinstance(function, Mapping) and bool(function.get("name"))
        if call_id is not None and call_id in self.by_id:
            self.last = self.by_id[call_id]
        elif call_id is not None or named or self.count == 0:
            self.last, self.count = self.count, self.count + 1
            if call_id is not None:
                self.by_id[call_id] = self.last
        return {**call, "index": self.last}


def reasoning_of(message: Mapping[str, Any]) -> str:
    """The reasoning text of a chat message or delta ('' for none), from the first of
    `reasoning_content`, `reasoning`, `reasoning_details` it carries."""
    for key in ("reasoning_content", "reasoning"):
        value = message.get(key)
        if isinstance(value, str):
            return value
    details = message.get("reasoning_details")
    if not isinstance(details, list):
        return ""
    texts = []
    for item in details:
        if isinstance(item, Mapping) and item.get("type") in _REASONING_ITEMS:
            text = item.get("text", item.get("summary"))
            texts.append(text if isinstance(text, str) else "")
    return "".join(texts)


def usage_in(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The usage an answer or chunk reports: its `usage`, else a vendor extension's; None."""
    usage = body.get("usage")
    if isinstance(usage, Mapping) and usage:
        return usage
    for key, value in body.items():
        if isinstance(key, str) and key.startswith("x_") and isinstance(value, Mapping):
            inner = value.get("usage")
            if isinstance(inner, Mapping) and inner:
                return inner
    return None


_COUNTS = ("prompt_tokens", "completion_tokens", "total_tokens")


def running_usage(before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> Mapping[str, Any]:
    """The usage a stream has reported once `after` follows `before`: `after`, with any count
    that fell below `before`'s raised back to it (a running total never falls; a report that
    says less is no proof that less was used)."""
    if before is None:
        return after
    raised = {
        key: before[key]
        for key in _COUNTS
        if _whole(before.get(key)) and _whole(after.get(key)) and after[key] < before[key]
    }
    return {**after, **raised} if raised else after


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _status(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)
    return value if isinstance(value, int) and 400 <= value <= 599 else None


def in_band_error(body: Mapping[str, Any]) -> tuple[int, dict[str, Any]] | None:
    """(the status the provider gave it, an OpenAI-shaped error body) for a chunk or answer that
    carries an `error` object (or message); None for any other. The body's `code` is the
    provider's code: its own string, else a typed code it gives (`metadata.error_type`)."""
    error = body.get("error")
    if isinstance(error, str) and error:
        error = {"message": error}
    if not isinstance(error, Mapping) or not error:
        return None
    status = next(
        (
            found
            for found in (_status(error.get(k)) for k in ("status_code", "status", "code"))
            if found is not None
        ),
        None,
    )
    metadata = error.get("metadata")
    typed = metadata.get("error_type") if isinstance(metadata, Mapping) else None
    code = next(
        (
            c
            for c in (error.get("code"), typed, error.get("type"), error.get("status"))
            if isinstance(c, str) and c and _status(c) is None
        ),
        None,
    )
    kind = error.get("type") if isinstance(error.get("type"), str) else None
    if status is None:
        status = _CODE_STATUS.get(code or "") or _CODE_STATUS.get(kind or "") or UNSTATED_STATUS
    message = error.get("message")
    said = {"message": message if isinstance(message, str) else "", "code": code, "type": kind}
    return status, {"error": said}

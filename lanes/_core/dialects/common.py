"""What the translations share: the request they produce, the error they raise, what they drop,
and small readers of chat-completions values. Pure.

Liberal in, exact out: a field a translation does not carry is never sent upstream and never
refuses the request — it is left out and named in `ChatRequest.dropped` (the job's audit row and
log line say so). A translation refuses (`BadField`) only what lanes can not honour *and* whose
loss would change what the client asked for: kept responses, a forced built-in tool, a document.
"""

from __future__ import annotations

# lanes: pure
import json
import json.encoder
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeGuard

import attrs
import msgspec

from lanes._core.model.arrival import encoded
from lanes._core.upstream.shapes import reasoning_of, usage_in


class BadField(ValueError):
    """A request the translation can not carry: `param` names the offending field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@attrs.frozen(kw_only=True)
class ChatRequest:
    """A request translated into chat completions: what a `Job` is built from."""

    model: str
    messages: list[dict[str, Any]]
    params: dict[str, Any]
    stream: bool = False
    dropped: tuple[str, ...] = ()  # what was left out, by name (never a value)
    reasoning_effort: str | None = None  # for the models that declare `reasoning` only


#: A reasoning effort a client asks for (OpenAI's `reasoning.effort`, the Messages API's
#: `output_config.effort`) → the one chat's `reasoning_effort` sends: the three levels every
#: reasoning lane honours, the nearest one for the others.
EFFORTS = {
    "none": "low",
    "minimal": "low",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "high",
    "max": "high",
}


def effort_of(value: Any) -> str | None:
    """The chat `reasoning_effort` for an asked-for effort, or None when it is not one."""
    return EFFORTS.get(value) if isinstance(value, str) else None


def sub_keys(where: str, value: Mapping[str, Any], read: set[str]) -> list[str]:
    """The keys of the object `where` other than those `read`, named `where.key`: dropped."""
    return [f"{where}.{key}" for key in value if key not in read]


def compact(value: Any) -> bytes:
    """`value` as compact JSON for a client, UTF-8: what `json.dumps(value, separators=(",", ":"),
    ensure_ascii=False)` writes, byte for byte where it holds no float (msgspec writes it, some
    ten times faster: a Responses event echoes the request's tools), and the same value where it
    does (msgspec spells an exponent `1e-5`, not `1e-05`). json's own writing where msgspec can
    not write it."""
    data = encoded(value)
    if data is None:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=_unwritten)
        return text.encode()
    return data


def _unwritten(value: Any) -> Any:
    """json's writing of what `written_once` wrote: the value it was written from."""
    if isinstance(value, msgspec.Raw):
        return msgspec.json.decode(value)
    raise TypeError(f"Object of type {value.__class__.__name__} is not JSON serializable")


#: shorter than this, a value is written where it stands
_WRITTEN_FROM = 512


def written_once(value: Any) -> Any:
    """`value` as `compact` writes it, once, for events that each repeat it (a Responses stream
    echoes the request's tools and instructions three times): a `msgspec.Raw` that `compact` puts
    in as it is, byte for byte what it would write for `value` there. Where an event goes json's
    way (msgspec can not write some other part of it), json writes the value msgspec wrote: the
    same, for what strict JSON gives — a request's members, which is what the doors hand here —
    but not for what it never holds (a NaN msgspec wrote as null, an enum or a date as text).
    `value` itself when short, or when msgspec can not write it."""
    data = encoded(value)
    return value if data is None or len(data) < _WRITTEN_FROM else msgspec.Raw(data)


#: json's own C encoder, made once (`json.dumps` makes one for each call it is given
#: `ensure_ascii=False`: two thirds of the time a tool call's short arguments take)
_C_ENCODER = getattr(json.encoder, "c_make_encoder", None)
_JSON_ENCODE = json.JSONEncoder(ensure_ascii=False).encode


def _spaced_encoder() -> Callable[[Any], str]:
    if _C_ENCODER is None:  # a Python without json's C speedups
        return _JSON_ENCODE
    encode = _C_ENCODER(
        None,  # no markers: a cycle goes json's own way, which names it
        json.JSONEncoder().default,
        json.encoder.encode_basestring,
        None,
        ": ",
        ", ",
        False,
        False,
        True,
    )

    def spaced(value: Any) -> str:
        if isinstance(value, str):
            return _JSON_ENCODE(value)
        try:
            return "".join(encode(value, 0))
        except RecursionError:  # a cycle, or nesting past the limit: json's own error, unchained
            pass
        return _JSON_ENCODE(value)

    return spaced


#: `value` as `json.dumps(value, ensure_ascii=False)` writes it (", " and ": " between items), the
#: same text and the same errors (but near the recursion limit, which it reaches a few levels
#: later: it calls fewer Python frames; what strict JSON gives nests 64 deep at most): what lanes
#: writes a tool call's arguments with
spaced = _spaced_encoder()


def sse_event(event: Mapping[str, Any]) -> bytes:
    """One event as server-sent-event bytes, its `type` as the event's name."""
    return b"".join((b"event: ", str(event["type"]).encode(), b"\ndata: ", compact(event), b"\n\n"))


def need(condition: bool, message: str, param: str) -> None:
    """Raise `BadField(message, param)` unless `condition`."""
    if not condition:
        raise BadField(message, param)


def need_text(value: Any, message: str, param: str) -> str:
    """`value`, a non-empty string; else raise `BadField(message, param)`."""
    need(isinstance(value, str) and bool(value), message, param)
    return str(value)


def is_object(value: Any) -> TypeGuard[Mapping[str, Any]]:
    """A JSON object: a dict (asked first: a type test, where an ABC's costs ten times as much, at
    every block of a long history) or another mapping."""
    return type(value) is dict or isinstance(value, Mapping)


def is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def text_of(content: Any) -> str:
    """The text of a chat message's content: a string, or the text parts of a list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text") or "")
            for part in content
            if isinstance(part, Mapping) and part.get("type") in ("text", "output_text")
        )
    return ""


def first_choice(completion: Mapping[str, Any]) -> tuple[Mapping[str, Any], str | None]:
    """(the first choice's message, its finish reason) of a `chat.completion`."""
    choices = completion.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], Mapping) else {}
    message = choice.get("message")
    reason = choice.get("finish_reason")
    return (message if isinstance(message, Mapping) else {}), (
        reason if isinstance(reason, str) else None
    )


def extra_of(call: Mapping[str, Any]) -> dict[str, Any] | None:
    """A tool call's `extra_content` (what a provider adds to it: Gemini's thought signature),
    when it holds something: not an empty object, nor one of empty ones (Gemini's unsigned calls
    say `{"google": {}}`), which need not go back upstream — nor to another provider that may
    refuse the field."""
    extra = call.get("extra_content")
    if not isinstance(extra, Mapping) or all(value in (None, {}, []) for value in extra.values()):
        return None
    return dict(extra)


def tool_calls_of(message: Mapping[str, Any]) -> list[tuple[str, str, str, dict[str, Any] | None]]:
    """(id, name, arguments, extra content or None) of each function call in a chat message."""
    out = []
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(function, Mapping):
            arguments = function.get("arguments")
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments if arguments is not None else {})
            name = str(function.get("name") or "")
            out.append((str(call.get("id") or ""), name, arguments, extra_of(call)))
    return out


def token_counts(usage: Any) -> tuple[int, int, int, int]:
    """(prompt, completion, cached prompt, reasoning) tokens from a chat `usage`, 0 when absent."""

    def count(value: Any) -> int:
        return value if is_int(value) and value >= 0 else 0

    if not isinstance(usage, Mapping):
        return 0, 0, 0, 0
    prompt_details = usage.get("prompt_tokens_details")
    completion_details = usage.get("completion_tokens_details")
    cached = prompt_details.get("cached_tokens") if isinstance(prompt_details, Mapping) else 0
    reasoning = (
        completion_details.get("reasoning_tokens") if isinstance(completion_details, Mapping) else 0
    )
    return (
        count(usage.get("prompt_tokens")),
        count(usage.get("completion_tokens")),
        count(cached),
        count(reasoning),
    )


class ChoiceReader:
    """Reads a stream of `chat.completion.chunk`s for the first choice: the text, the tool-call
    pieces, the finish reason and the usage, as a translation to another event stream needs them.
    """

    def __init__(self) -> None:
        self.model: str | None = None
        self.finish_reason: str | None = None
        self.usage: Mapping[str, Any] | None = None

    def read(self, chunk: Mapping[str, Any]) -> list[tuple[str, Any]]:
        """The pieces of one chunk, in order: ("thinking", str), ("text", str) and ("tool",
        (index, id, name, arguments, extra content)); it notes the model, finish reason and usage
        (wherever the provider put it: the last one counts) as they pass."""
        if isinstance(chunk.get("model"), str) and self.model is None:
            self.model = chunk["model"]
        if (usage := usage_in(chunk)) is not None:
            self.usage = usage
        pieces: list[tuple[str, Any]] = []
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, Mapping) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            delta = delta if isinstance(delta, Mapping) else {}
            if thinking := reasoning_of(delta):
                pieces.append(("thinking", thinking))
            for key in ("content", "refusal"):
                if isinstance(delta.get(key), str) and delta[key]:
                    pieces.append(("text", delta[key]))
            pieces += _tool_pieces(delta)
            if isinstance(choice.get("finish_reason"), str) and choice["finish_reason"]:
                self.finish_reason = choice["finish_reason"]
        return pieces


def _tool_pieces(delta: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """("tool", (index, id, name, arguments, extra content)) for each tool-call piece of a
    chunk's `delta`: its position when it has no index, None for an id or name that is not text
    and for no extra content, "" for arguments."""
    for position, call in enumerate(delta.get("tool_calls") or ()):
        if not isinstance(call, Mapping):
            continue
        function = call.get("function")
        function = function if isinstance(function, Mapping) else {}
        index = call["index"] if is_int(call.get("index")) else position
        call_id, name, arguments = (
            value if isinstance(value, str) else None
            for value in (call.get("id"), function.get("name"), function.get("arguments"))
        )
        yield "tool", (index, call_id, name, arguments or "", extra_of(call))

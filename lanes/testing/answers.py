"""What a simulated provider says to one request: a completion, its stream chunks, or embeddings.
Pure: the same request always gets the same answer.

An agent can be tried against it:
- `tools`, when the last message is the user's (system messages after it aside, as Claude Code
  sends one): a well-formed call of the first tool (or the one `tool_choice` names), its
  arguments valid against the tool's parameter schema;
- after a tool result: the final answer — or, when `tool_choice` is `required`, a call of the
  first tool not yet called;
- `response_format` `json_object`: `{"answer": text}`; `json_schema`: a value valid against it;
- `n` choices; `max_tokens` (or `max_completion_tokens`) truncates with `finish_reason: length`;
- usage always, counted as one token per four characters, in a stream on the last chunk too.
"""

from __future__ import annotations

# lanes: pure
import base64
import hashlib
import json
import math
import struct
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import attrs

from lanes.testing.schema import instance

#: The dimension of a simulated embedding when the request does not ask for one.
EMBEDDING_DIMENSIONS = 16
MAX_CHOICES = 16
#: Messages that instruct rather than take a turn: a system entry after the user's message does
#: not stop the tool call the user's message asks for.
_INSTRUCTIONS = ("system", "developer")


@attrs.frozen(kw_only=True)
class Choice:
    """One simulated choice: text, or tool calls (OpenAI's `tool_calls` objects)."""

    content: str | None
    tool_calls: tuple[Mapping[str, Any], ...] = ()
    finish_reason: str = "stop"


def tokens(text: str) -> int:
    """The simulator's token count: one per four characters, at least one."""
    return max(1, len(text) // 4)


def _tools(request: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    tools = request.get("tools")
    return [
        t["function"]
        for t in tools or ()
        if isinstance(t, Mapping)
        and isinstance(t.get("function"), Mapping)
        and isinstance(t["function"].get("name"), str)
    ]


def _called(messages: Sequence[Any]) -> set[str]:
    names = set()
    for message in messages:
        for call in (message.get("tool_calls") or ()) if isinstance(message, Mapping) else ():
            function = call.get("function") if isinstance(call, Mapping) else None
            if isinstance(function, Mapping) and isinstance(function.get("name"), str):
                names.add(function["name"])
    return names


def _tool_to_call(request: Mapping[str, Any], messages: Sequence[Any]) -> Mapping[str, Any] | None:
    """The tool this request gets a call of, or None for a text answer."""
    tools, choice = _tools(request), request.get("tool_choice", "auto")
    if not tools or choice == "none":
        return None
    turns = [m for m in messages if not (isinstance(m, Mapping) and m.get("role") in _INSTRUCTIONS)]
    last = turns[-1] if turns and isinstance(turns[-1], Mapping) else {}
    if isinstance(choice, Mapping):
        name = (
            (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
        )
        return next((t for t in tools if t["name"] == name), tools[0])
    if last.get("role") == "user":
        return tools[0]
    if last.get("role") == "tool" and choice == "required":
        called = _called(messages)
        return next((t for t in tools if t["name"] not in called), tools[0])
    return None


def _json_answer(request: Mapping[str, Any], text: str) -> str | None:
    response_format = request.get("response_format")
    if not isinstance(response_format, Mapping):
        return None
    if response_format.get("type") == "json_object":
        return json.dumps({"answer": text})
    if response_format.get("type") == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema", {}) if isinstance(spec, Mapping) else {}
        return json.dumps(instance(schema))
    return None


def _call_id(messages: Sequence[Any], name: str, index: int) -> str:
    """A call's id, the same for the same request: of the history's length and its last message
    (not the whole history written out: a provider's time does not grow with the history's size
    this way, and at 512 KB that took the fake 2.7 ms a call, which a benchmark of what a router
    adds counted as the router's). Unique within a conversation (each turn lengthens it); two
    conversations of one length that end in the same message get the same ids."""
    last = messages[-1] if messages else None
    seed = json.dumps([len(messages), last, name, index], sort_keys=True, default=str).encode()
    return "call_" + hashlib.sha256(seed).hexdigest()[:24]


def completion_cap(request: Mapping[str, Any]) -> int | None:
    """The cap on a request's completion tokens as OpenAI reads it (the fakes and the what-if's
    providers read requests as a provider would, not as lanes does)."""
    caps = (request.get(key) for key in ("max_completion_tokens", "max_tokens"))
    return next((c for c in caps if type(c) is int and c > 0), None)


def choices(request: Mapping[str, Any], text: str) -> list[Choice]:
    """The choices the simulator answers `request` (a chat-completions body) with; `text` is its
    plain answer."""
    messages = request.get("messages")
    messages = messages if isinstance(messages, list) else []
    n = request.get("n", 1)
    n = min(n, MAX_CHOICES) if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1
    cap = completion_cap(request)
    tool = _tool_to_call(request, messages)
    out = []
    for index in range(n):
        if tool is not None:
            arguments = json.dumps(instance(tool.get("parameters") or {"type": "object"}))
            finish = "tool_calls"
            if cap is not None and tokens(arguments) > cap:
                arguments, finish = arguments[: cap * 4], "length"
            call = {
                "id": _call_id(messages, tool["name"], index),
                "type": "function",
                "function": {"name": tool["name"], "arguments": arguments},
            }
            out.append(Choice(content=None, tool_calls=(call,), finish_reason=finish))
            continue
        content = _json_answer(request, text) or text
        finish = "stop"
        if cap is not None and tokens(content) > cap:
            content, finish = content[: cap * 4], "length"
        out.append(Choice(content=content, finish_reason=finish))
    return out


def usage(request: Mapping[str, Any], answered: Sequence[Choice]) -> dict[str, int]:
    prompt = tokens(json.dumps(request.get("messages", [])))
    completion = sum(
        tokens(c.content or "".join(t["function"]["arguments"] for t in c.tool_calls))
        for c in answered
    )
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def completion(request: Mapping[str, Any], text: str, model: str) -> dict[str, Any]:
    """A `chat.completion` body."""
    answered = choices(request, text)
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "system_fingerprint": "fp_fake",
        "choices": [
            {
                "index": i,
                "message": {
                    "role": "assistant",
                    "content": c.content,
                    **({"tool_calls": [dict(t) for t in c.tool_calls]} if c.tool_calls else {}),
                },
                "finish_reason": c.finish_reason,
            }
            for i, c in enumerate(answered)
        ],
        "usage": usage(request, answered),
    }


def chunk(
    model: str, delta: Mapping[str, Any], finish: str | None = None, index: int = 0
) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": model,
        "system_fingerprint": "fp_fake",
        "choices": [{"index": index, "delta": dict(delta), "finish_reason": finish}],
    }


def _pieces(text: str, *, by_words: bool) -> list[str]:
    if by_words:
        words = text.split(" ")
        return [w if i == 0 else " " + w for i, w in enumerate(words)]
    return [text[i : i + 8] for i in range(0, len(text), 8)] or [""]


def chunks(request: Mapping[str, Any], text: str, model: str) -> list[dict[str, Any]]:
    """The `chat.completion.chunk`s of a streamed answer: per choice a role chunk, the content one
    word at a time (or the tool call: id and name, then its arguments in pieces), then the finish
    — the last one carrying the usage."""
    return list(iter_chunks(request, text, model))


def iter_chunks(request: Mapping[str, Any], text: str, model: str) -> Iterator[dict[str, Any]]:
    """`chunks`, made one at a time as they are taken: a fake streaming a long answer sends its
    first chunk at once, not after building them all."""
    answered = choices(request, text)
    for i, c in enumerate(answered):
        if c.tool_calls:
            yield chunk(model, {"role": "assistant", "content": None}, index=i)
            for t, call in enumerate(c.tool_calls):
                head = {"name": call["function"]["name"], "arguments": ""}
                opened = {"index": t, "id": call["id"], "type": "function", "function": head}
                yield chunk(model, {"tool_calls": [opened]}, index=i)
                for piece in _pieces(call["function"]["arguments"], by_words=False):
                    delta = {"tool_calls": [{"index": t, "function": {"arguments": piece}}]}
                    yield chunk(model, delta, index=i)
        else:
            yield chunk(model, {"role": "assistant", "content": ""}, index=i)
            for p in _pieces(c.content or "", by_words=True):
                yield chunk(model, {"content": p}, index=i)
        last = chunk(model, {}, finish=c.finish_reason, index=i)
        if i == len(answered) - 1:
            last["usage"] = usage(request, answered)
        yield last


def _vector(value: Any, dimensions: int) -> list[float]:
    seed = json.dumps(value, sort_keys=True).encode()
    raw = b""
    counter = 0
    while len(raw) < 4 * dimensions:
        raw += hashlib.sha256(seed + counter.to_bytes(4, "big")).digest()
        counter += 1
    numbers = [
        (int.from_bytes(raw[4 * i : 4 * i + 4], "big") / 2**32) * 2 - 1 for i in range(dimensions)
    ]
    norm = math.sqrt(sum(x * x for x in numbers)) or 1.0
    return [x / norm for x in numbers]


def embedding_inputs(value: Any) -> list[Any]:
    """The separate inputs of an embeddings request: a string, a token list, or a list of either."""
    if isinstance(value, list) and value and not all(isinstance(v, int) for v in value):
        return value
    return [value]


def embeddings(request: Mapping[str, Any], model: str) -> dict[str, Any]:
    """An embeddings `list` body: one unit vector per input, the same for the same input;
    `dimensions` honoured, `encoding_format: base64` as little-endian float32."""
    dimensions = request.get("dimensions")
    if type(dimensions) is not int or not 0 < dimensions <= 4096:  # a bool is no dimension
        dimensions = EMBEDDING_DIMENSIONS
    inputs = embedding_inputs(request.get("input"))
    data = []
    for i, value in enumerate(inputs):
        vector: Any = _vector(value, dimensions)
        if request.get("encoding_format") == "base64":
            vector = base64.b64encode(struct.pack(f"<{dimensions}f", *vector)).decode()
        data.append({"object": "embedding", "index": i, "embedding": vector})
    prompt = sum(len(v) if isinstance(v, list) else tokens(str(v)) for v in inputs)
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": prompt, "total_tokens": prompt},
    }

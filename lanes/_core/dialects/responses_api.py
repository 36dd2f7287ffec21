"""OpenAI's Responses API ⇄ chat completions. Pure.

`to_chat(body)` turns a `POST /v1/responses` body into a chat request (input items become
messages, `instructions` a system message, function tools chat tools, `text.format` a
`response_format`, `max_output_tokens` a `max_tokens`); the answer's way back is
`responses_reply.py`.

lanes keeps no responses, so `previous_response_id` (and `conversation`, `background`, stored
prompts) are refused with a clear error naming the field; the whole conversation goes in `input`.
Every other field it does not translate (`client_metadata`, `include`, `store`,
`context_management`, a field invented tomorrow, …) is dropped and named in `dropped`;
`reasoning.effort` becomes the job's `reasoning_effort` (sent to reasoning models only). Tools:
`responses_tools.py`. A tool call's `extra_content` (Gemini 3's thought signature, which it needs
back) rides in the `call_id` the client is given, and comes back from it (`call_ids.py`).
"""

from __future__ import annotations

# lanes: pure
from collections.abc import Mapping
from typing import Any

from lanes._core.dialects import responses_tools
from lanes._core.dialects.call_ids import restored
from lanes._core.dialects.common import (
    BadField,
    ChatRequest,
    effort_of,
    is_int,
    is_object,
    need,
    need_text,
    sub_keys,
    text_of,
)
from lanes._core.freetier.prices import MAX_TOKENS

#: Fields that are read; the others are dropped (and named), except `STATEFUL` ones when set.
TRANSLATED = {
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "text",
    "max_output_tokens",
    "temperature",
    "top_p",
    "stream",
    "parallel_tool_calls",
    "metadata",
    "user",
    "reasoning",
}
#: Fields that need responses kept on the server, which lanes does not do.
STATEFUL = ("previous_response_id", "conversation", "prompt", "background")
#: Input items that record a built-in tool's run: the answer that used them is in the conversation
#: already, and lanes offers no such tool; they are dropped (as `reasoning` items are).
_TOOL_RECORDS = {
    "reasoning",
    "web_search_call",
    "file_search_call",
    "code_interpreter_call",
    "image_generation_call",
}
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


def to_chat(body: Mapping[str, Any]) -> ChatRequest:
    """The chat request for a Responses API body. Raises `BadField` naming what it can not carry."""
    for key in STATEFUL:
        need(
            body.get(key) in (None, False),
            f"{key} is not supported: lanes keeps no responses; send the whole conversation in "
            "'input' (and store=false)",
            key,
        )
    dropped = [key for key in body if key not in TRANSLATED and key not in STATEFUL]
    model = body.get("model", "auto")
    need(isinstance(model, str) and bool(model), "'model' must be a non-empty string", "model")
    stream = body.get("stream", False)
    need(isinstance(stream, bool), "'stream' must be a boolean", "stream")
    tools = responses_tools.translate(body.get("tools"))
    dropped += tools.dropped
    messages = _messages(body.get("input"), body.get("instructions"), tools, dropped)
    params: dict[str, Any] = {}
    for key in ("temperature", "top_p", "user"):
        if body.get(key) is not None:
            params[key] = body[key]
    if body.get("max_output_tokens") is not None:
        cap = body["max_output_tokens"]
        need(
            is_int(cap) and 0 < cap <= MAX_TOKENS,
            f"'max_output_tokens' must be a whole number in 1..{MAX_TOKENS}",
            "max_output_tokens",
        )
        params["max_tokens"] = cap
    metadata = body.get("metadata")
    need(
        metadata is None or isinstance(metadata, Mapping),
        "'metadata' must be an object",
        "metadata",
    )
    if tools.chat:
        params["tools"] = tools.chat
        if body.get("parallel_tool_calls") is not None:
            params["parallel_tool_calls"] = bool(body["parallel_tool_calls"])
    if body.get("tool_choice") is not None:
        choice = responses_tools.tool_choice(body["tool_choice"], tools)
        if tools.chat:
            params["tool_choice"] = choice
        else:  # chat refuses a tool_choice without tools; "auto" and "none" mean nothing here
            dropped.append("tool_choice")
    response_format = _format(body.get("text"), dropped)
    if response_format is not None:
        params["response_format"] = response_format
    effort = _effort(body.get("reasoning"), dropped)
    return ChatRequest(
        model=model,
        messages=messages,
        params=params,
        stream=stream,
        dropped=tuple(dropped),
        reasoning_effort=effort,
    )


def _effort(reasoning: Any, dropped: list[str]) -> str | None:
    """`reasoning.effort` as chat's `reasoning_effort`; the rest of `reasoning` is dropped."""
    if reasoning is None:
        return None
    if not isinstance(reasoning, Mapping):
        dropped.append("reasoning")
        return None
    effort = effort_of(reasoning.get("effort"))
    dropped += sub_keys("reasoning", reasoning, {"effort"} if effort else set())
    return effort


def _messages(
    items: Any, instructions: Any, tools: responses_tools.Tools, dropped: list[str]
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if instructions is not None:
        need(isinstance(instructions, str), "'instructions' must be a string", "instructions")
        if instructions:
            out.append({"role": "system", "content": instructions})
    if isinstance(items, str):
        need(bool(items), "'input' must not be empty", "input")
        return [*out, {"role": "user", "content": items}]
    need(
        isinstance(items, list) and bool(items),
        "'input' must be a string or a non-empty array",
        "input",
    )
    calls_open = False  # the last message is an assistant turn that further calls may join
    for i, item in enumerate(items):
        # the field an error names is spelled only when there is one: a 512 KB history holds
        # hundreds of items
        kind = item.get("type", "message" if "role" in item else None) if is_object(item) else {}
        if kind == "message":
            out.append(_message(item, f"input[{i}]"))
            calls_open = out[-1]["role"] == "assistant"
        elif kind == "function_call":
            call = _function_call(item, i, tools)
            if calls_open:
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
                calls_open = True
        elif kind == "function_call_output":
            out.append(_output(item, i))
            calls_open = False
        elif isinstance(kind, str) and kind in _TOOL_RECORDS:  # (a dict is in no set: a 500)
            dropped.append(f"input.{kind}")  # chat completions has no place for it
        else:
            _unsupported(item, f"input[{i}]")
    need(any(m["role"] != "system" for m in out), "'input' holds no message", "input")
    return out


def _unsupported(item: Any, param: str) -> None:
    """Raise the `BadField` for an input item that is not an object, or of no type lanes
    bridges."""
    need(is_object(item), f"{param} must be an object", param)
    kind = item.get("type", "message" if "role" in item else None)
    raise BadField(
        f"{param}.type {str(kind)[:64]!r} is not supported: lanes bridges to chat "
        "completions (message, function_call, function_call_output)",
        f"{param}.type",
    )


def _output(item: Mapping[str, Any], i: int) -> dict[str, Any]:
    """A `function_call_output` item as a `tool` message."""
    call_id, _ = restored(_call_id(item, i))  # the id it went upstream with
    output = item.get("output")
    text = (
        output if isinstance(output, str) else text_of(_parts(output, f"input[{i}].output", "tool"))
    )
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _message(item: Mapping[str, Any], param: str) -> dict[str, Any]:
    raw_role = item.get("role")
    role = _ROLES.get(raw_role) if isinstance(raw_role, str) else None
    need(
        role is not None,
        f"{param}.role must be user, assistant, system or developer",
        f"{param}.role",
    )
    assert role is not None
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    parts = _parts(content, f"{param}.content", role)
    if role != "user" or all(p["type"] == "text" for p in parts):
        return {"role": role, "content": text_of(parts)}
    return {"role": role, "content": parts}


def _parts(content: Any, param: str, role: str) -> list[dict[str, Any]]:
    """Responses content parts as chat content parts (text and images)."""
    need(isinstance(content, list), f"{param} must be a string or an array of parts", param)
    parts = []
    for j, part in enumerate(content):
        where = f"{param}[{j}]"
        need(isinstance(part, Mapping), f"{where} must be an object", where)
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text", "refusal"):
            text = part.get("text", part.get("refusal"))
            need(isinstance(text, str), f"{where}.text must be a string", f"{where}.text")
            parts.append({"type": "text", "text": text})
        elif kind == "input_image" and role == "user":
            url = need_text(
                part.get("image_url"),
                f"{where}.image_url must be a URL or a data: URL (file ids are not supported)",
                f"{where}.image_url",
            )
            image = {"url": url, **({"detail": part["detail"]} if part.get("detail") else {})}
            parts.append({"type": "image_url", "image_url": image})
        else:
            raise BadField(f"{where}.type {kind!r} is not supported here", f"{where}.type")
    return parts


def _function_call(item: Mapping[str, Any], i: int, tools: responses_tools.Tools) -> dict[str, Any]:
    call_id, extra = restored(_call_id(item, i))
    name: Any = item.get("name")
    arguments = item.get("arguments", "")
    if not (isinstance(name, str) and name and isinstance(arguments, str)):
        param = f"input[{i}]"
        need_text(name, f"{param}.name must be a string", f"{param}.name")
        need(
            isinstance(arguments, str), f"{param}.arguments must be a string", f"{param}.arguments"
        )
    flat = tools.flat_name(item.get("namespace"), name)  # the name its tool went upstream by
    call = {"id": call_id, "type": "function", "function": {"name": flat, "arguments": arguments}}
    return call if extra is None else {**call, "extra_content": extra}


def _call_id(item: Mapping[str, Any], i: int) -> str:
    call_id = item.get("call_id")
    if not (isinstance(call_id, str) and call_id):
        raise BadField(f"input[{i}].call_id must be a string", f"input[{i}].call_id")
    return call_id


def _format(text: Any, dropped: list[str]) -> dict[str, Any] | None:
    """`text.format` as a chat `response_format`; the rest of `text` (`verbosity`) is dropped."""
    if text is None:
        return None
    need(isinstance(text, Mapping), "'text' must be an object", "text")
    dropped += sub_keys("text", text, {"format"})
    spec = text.get("format")
    if spec is None:
        return None
    need(isinstance(spec, Mapping), "text.format must be an object", "text.format")
    kind = spec.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        need(
            isinstance(spec.get("schema"), Mapping),
            "text.format.schema must be an object",
            "text.format.schema",
        )
        schema = {k: spec[k] for k in ("name", "schema", "description", "strict") if k in spec}
        schema.setdefault("name", "response")
        return {"type": "json_schema", "json_schema": schema}
    raise BadField("text.format.type must be text, json_object or json_schema", "text.format.type")

"""The Messages API (`POST /v1/messages`, as Claude clients speak it) ⇄ chat completions. Pure.

`to_chat(body)`: `system` becomes a system message, and so does a `{"role": "system"}` entry
inside `messages`, at its place; each message's blocks become chat messages — text and images as
content, `tool_use` as the assistant's tool calls, each `tool_result` as a `tool` message (before
the rest of that user turn); client tools become function tools, `tool_choice` (`auto`, `any`,
`tool`, `none`) its chat counterpart (`messages_tools.py`), `stop_sequences` become `stop`,
`output_config.format` (a JSON schema, as the SDK's `messages.parse` sends it; or the beta's
top-level `output_format`, as LiteLLM sends it) a `response_format` and `output_config.effort`
the job's `reasoning_effort` (sent to reasoning models only). Every other
field (`thinking`, `context_management`, `cache_control`, `diagnostics`, a field invented
tomorrow, …), server tool and `thinking` block is dropped and named in `dropped`; refused are
only `mcp_servers` with entries, a server tool `tool_choice` forces, and documents.
A tool call's `extra_content` (Gemini 3's thought signature, which it needs back) rides in the
`tool_use` id the client is given, and comes back from it (`call_ids.py`).
The answer's way back is `messages_reply.py`.
"""

from __future__ import annotations

# lanes: pure
import re
from collections.abc import Mapping
from typing import Any

from lanes._core.dialects.call_ids import restored
from lanes._core.dialects.common import (
    BadField,
    ChatRequest,
    effort_of,
    is_int,
    is_object,
    need,
    need_text,
    spaced,
    sub_keys,
    text_of,
)
from lanes._core.dialects.messages_tools import tool_choice_of, tools_of

#: Fields that are read; the others are dropped (and named), `mcp_servers` refused when it has
#: entries.
TRANSLATED = {
    "model",
    "messages",
    "max_tokens",
    "system",
    "stop_sequences",
    "stream",
    "temperature",
    "top_p",
    "tools",
    "tool_choice",
    "metadata",
    "output_config",
    "output_format",
    "mcp_servers",
}

#: A `metadata.user_id` passed on as chat's `user`: a short plain identifier. Anything else (Claude
#: Code puts a JSON object of device and session ids there) is dropped, not sent to providers.
_USER_ID = re.compile(r"[A-Za-z0-9_.:@-]{1,64}")


def to_chat(body: Mapping[str, Any]) -> ChatRequest:
    """The chat request for a Messages API body. Raises `BadField` naming what it can not carry."""
    dropped = [key for key in body if key not in TRANSLATED]
    need(
        not body.get("mcp_servers"),
        "mcp_servers are not supported: the provider would call the MCP servers; declare their "
        "tools as client tools",
        "mcp_servers",
    )
    model = need_text(body.get("model"), "model: Field required (a non-empty string)", "model")
    cap: Any = body.get("max_tokens")
    need(is_int(cap) and cap > 0, "max_tokens: Field required (a positive integer)", "max_tokens")
    stream = body.get("stream", False)
    need(isinstance(stream, bool), "stream: must be a boolean", "stream")
    messages = _system(body.get("system")) + _messages(body.get("messages"), dropped)
    params: dict[str, Any] = {"max_tokens": cap}
    params |= {key: body[key] for key in ("temperature", "top_p") if body.get(key) is not None}
    if stops := body.get("stop_sequences"):
        need(
            isinstance(stops, list) and all(isinstance(s, str) for s in stops),
            "stop_sequences: must be an array of strings",
            "stop_sequences",
        )
        params["stop"] = list(stops)
    if (user := _user_id(body.get("metadata"), dropped)) is not None:
        params["user"] = user
    tools = tools_of(body.get("tools"), body.get("tool_choice"), dropped)
    if tools:
        params["tools"] = tools
    if body.get("tool_choice") is not None:
        choice, parallel = tool_choice_of(body["tool_choice"])
        need(
            choice != "required" or bool(tools),
            "tool_choice.type: 'any' needs a client tool, and none of the given tools is one "
            "lanes can offer",
            "tool_choice.type",
        )
        if tools:
            params["tool_choice"] = choice
            if parallel is False:
                params["parallel_tool_calls"] = False
        else:  # chat refuses a tool_choice without tools
            dropped.append("tool_choice")
    effort, response_format = _output_config(body.get("output_config"), dropped)
    if response_format is None and body.get("output_format") is not None:
        response_format = _format(body["output_format"], "output_format")
    if response_format is not None:
        params["response_format"] = response_format
    return ChatRequest(
        model=model,
        messages=messages,
        params=params,
        stream=stream,
        dropped=tuple(dropped),
        reasoning_effort=effort,
    )


def _user_id(metadata: Any, dropped: list[str]) -> str | None:
    """`metadata.user_id` as chat's `user`, when it is a short plain identifier."""
    if not isinstance(metadata, Mapping):
        if metadata is not None:
            dropped.append("metadata")
        return None
    dropped += sub_keys("metadata", metadata, {"user_id"})
    user = metadata.get("user_id")
    if isinstance(user, str) and _USER_ID.fullmatch(user):
        return user
    if user is not None:
        dropped.append("metadata.user_id")
    return None


def _output_config(config: Any, dropped: list[str]) -> tuple[str | None, dict[str, Any] | None]:
    """(the reasoning effort, the chat `response_format`) of `output_config`; the rest of it is
    dropped. A format other than a JSON schema is refused: the answer's shape would change."""
    if config is None:
        return None, None
    need(isinstance(config, Mapping), "output_config: must be an object", "output_config")
    effort = effort_of(config.get("effort"))
    read = {"format", *(("effort",) if effort else ())}
    dropped += sub_keys("output_config", config, read)
    spec = config.get("format")
    return effort, (None if spec is None else _format(spec, "output_config.format"))


def _format(spec: Any, where: str) -> dict[str, Any]:
    """The chat `response_format` of a structured-output format (`output_config.format`, or the
    beta's `output_format`): only a JSON schema, else refused, since the answer's shape would
    change."""
    need(
        isinstance(spec, Mapping) and spec.get("type") == "json_schema",
        f"{where}.type: must be json_schema",
        f"{where}.type",
    )
    need(
        isinstance(spec.get("schema"), Mapping),
        f"{where}.schema: Field required (an object)",
        f"{where}.schema",
    )
    schema = {"name": "response", "schema": dict(spec["schema"])}
    return {"type": "json_schema", "json_schema": schema}


def _system(system: Any, param: str = "system") -> list[dict[str, Any]]:
    """A system prompt (a string or text blocks; their `cache_control` has no meaning upstream)
    as a system message."""
    where = param if param == "system" else f"{param}.content"
    if system is None or system == "":
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}]
    need(isinstance(system, list), f"{where}: must be a string or an array of text blocks", where)
    texts = []
    for i, block in enumerate(system):
        need(
            isinstance(block, Mapping)
            and block.get("type") == "text"
            and isinstance(block.get("text"), str),
            f"{where}.{i}: must be a text block",
            f"{where}.{i}",
        )
        texts.append(block["text"])
    return [{"role": "system", "content": "\n\n".join(texts)}] if texts else []


def _messages(messages: Any, dropped: list[str]) -> list[dict[str, Any]]:
    need(
        isinstance(messages, list) and bool(messages),
        "messages: must be a non-empty array",
        "messages",
    )
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        # what is checked at every message and block of a 512 KB history is checked first, and
        # the field it names is spelled only when it is wrong
        role = message.get("role") if is_object(message) else None
        content = message.get("content") if role in _ROLES else None
        if role == "system":  # a system entry mid-conversation: a system message at its place
            out += _system(content, f"messages.{i}")
        elif isinstance(content, str):
            out.append({"role": role, "content": content})
        elif isinstance(content, list) and role == "assistant":
            out += _assistant(content, i, dropped)
        elif isinstance(content, list):
            out += _user(content, i)
        else:
            _check_message(message, f"messages.{i}")
    need(
        any(m["role"] != "system" for m in out),
        "messages: must hold a user or assistant turn",
        "messages",
    )
    return out


_ROLES = ("user", "assistant", "system")


def _check_message(message: Any, param: str) -> None:
    """Raise the `BadField` naming what is wrong with a message that is not a system entry, and
    has no text and no array as its content."""
    need(is_object(message), f"{param}: must be an object", param)
    need(
        message.get("role") in _ROLES,
        f"{param}.role: must be user, assistant or system",
        f"{param}.role",
    )
    raise BadField(f"{param}.content: must be a string or an array", f"{param}.content")


def _at(i: int, j: int) -> str:
    """The name of block `j` of message `i`, for an error."""
    return f"messages.{i}.content.{j}"


def _assistant(blocks: list[Any], i: int, dropped: list[str]) -> list[dict[str, Any]]:
    texts, calls = [], []
    for j, block in enumerate(blocks):
        kind = _kind(block, i, j)
        if kind == "text":
            texts.append(_text(block, i, j))
        elif kind == "tool_use":
            calls.append(_tool_use(block, i, j))
        elif kind in ("thinking", "redacted_thinking"):
            dropped.append(f"messages.content.{kind}")  # chat completions has no place for it
        else:
            raise BadField(
                f"{_at(i, j)}.type: {kind!r} is not supported in an assistant turn",
                f"{_at(i, j)}.type",
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    elif message["content"] is None:
        message["content"] = ""
    return [message]


def _user(blocks: list[Any], i: int) -> list[dict[str, Any]]:
    """A user turn: its tool results as `tool` messages first (each right after the call it
    answers), then one user message with its own text and images — and the images the tool
    results held, which a `tool` message can not carry."""
    results, parts, shown = [], [], []
    for j, block in enumerate(blocks):
        kind = _kind(block, i, j)
        if kind == "text":
            parts.append({"type": "text", "text": _text(block, i, j)})
        elif kind == "image":
            parts.append(_image(block, _at(i, j)))
        elif kind == "tool_result":
            message, images = _tool_result(block, i, j)
            results.append(message)
            shown += images
        else:
            raise BadField(f"{_at(i, j)}.type: {kind!r} is not supported", f"{_at(i, j)}.type")
    out = results
    parts = shown + parts
    if parts:
        content: Any = parts if any(p["type"] != "text" for p in parts) else text_of(parts)
        out = [*out, {"role": "user", "content": content}]
    return out


def _kind(block: Any, i: int, j: int) -> str:
    """The `type` of block `j` of message `i`."""
    kind = block.get("type") if is_object(block) else None
    return kind if isinstance(kind, str) else _kind_at(block, _at(i, j))


def _kind_at(block: Any, where: str) -> str:
    """The `type` of the block `where`."""
    need(is_object(block), f"{where}: must be an object", where)
    kind = block.get("type")
    need(isinstance(kind, str), f"{where}.type: Field required", f"{where}.type")
    return str(kind)


def _text(block: Mapping[str, Any], i: int, j: int) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise BadField(f"{_at(i, j)}.text: must be a string", f"{_at(i, j)}.text")
    return text


def _image(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    source: Any = block.get("source")
    need(isinstance(source, Mapping), f"{where}.source: Field required", f"{where}.source")
    if source.get("type") == "base64":
        media, data = source.get("media_type"), source.get("data")
        need(
            isinstance(media, str) and isinstance(data, str),
            f"{where}.source: media_type and data are required",
            f"{where}.source",
        )
        return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{data}"}}
    if source.get("type") == "url" and isinstance(source.get("url"), str):
        return {"type": "image_url", "image_url": {"url": source["url"]}}
    raise BadField(f"{where}.source.type: must be base64 or url", f"{where}.source.type")


def _tool_use(block: Mapping[str, Any], i: int, j: int) -> dict[str, Any]:
    call_id: Any = block.get("id")
    name, arguments = block.get("name"), block.get("input", {})
    named = isinstance(call_id, str) and call_id and isinstance(name, str) and name
    if not (named and is_object(arguments)):
        _check_tool_use(block, _at(i, j))
    upstream_id, extra = restored(call_id)
    call: dict[str, Any] = {
        "id": upstream_id,
        "type": "function",
        "function": {"name": name, "arguments": spaced(arguments)},
    }
    if extra is not None:
        call["extra_content"] = extra
    return call


def _check_tool_use(block: Mapping[str, Any], where: str) -> None:
    """Raise the `BadField` naming the first field of a `tool_use` block that is wrong."""
    need_text(block.get("id"), f"{where}.id: Field required", f"{where}.id")
    name = block.get("name")
    need(isinstance(name, str) and bool(name), f"{where}.name: Field required", f"{where}.name")
    need(
        is_object(block.get("input", {})),
        f"{where}.input: must be an object",
        f"{where}.input",
    )


def _tool_result(
    block: Mapping[str, Any], i: int, j: int
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The `tool` message answering a call, and the images the result held (as user image
    parts: a `tool` message holds text only; the text says they follow)."""
    given = block.get("tool_use_id")
    if not (isinstance(given, str) and given):
        raise BadField(f"{_at(i, j)}.tool_use_id: Field required", f"{_at(i, j)}.tool_use_id")
    call_id, _ = restored(given)  # the id the call went upstream with
    content = block.get("content", "")
    images: list[dict[str, Any]] = []
    if isinstance(content, list):
        content, images = _result_parts(content, _at(i, j))
    if not isinstance(content, str):
        where = _at(i, j)
        raise BadField(f"{where}.content: must be a string or text blocks", f"{where}.content")
    if block.get("is_error"):
        content = f"Error: {content}"
    return {"role": "tool", "tool_call_id": call_id, "content": content}, images


def _result_parts(content: list[Any], where: str) -> tuple[str, list[dict[str, Any]]]:
    """The text of a tool result's blocks (saying when images follow), and its images."""
    texts, images = [], []
    for k, part in enumerate(content):
        inner = f"{where}.content.{k}"
        kind = _kind_at(part, inner)
        need(
            kind in ("text", "image"),
            f"{inner}.type: only text and images are supported in a tool result",
            f"{inner}.type",
        )
        if kind == "image":
            images.append(_image(part, inner))
        else:
            texts.append(part)
    text = text_of(texts)
    if images:
        note = f"[{len(images)} image(s) of this result follow in the next user message]"
        text = f"{text}\n{note}" if text else note
    return text, images

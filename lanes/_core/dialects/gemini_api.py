"""Gemini's API (`POST /v1beta/models/{model}:generateContent` and `:streamGenerateContent`, as
the google-genai SDKs and Gemini CLI speak it) → chat completions. Pure. The answer going back is
`gemini_reply.py`.

`to_chat(body, model=..., stream=...)`: the model and the streaming come from the path, not the
body. `systemInstruction` becomes a system message; each of `contents` becomes chat messages —
`user` text and images (`inlineData`, or `fileData` naming an http(s) image) as content, each
`functionResponse` as a `tool` message (before the rest of that turn); `model` text and each
`functionCall` as the assistant's content and tool calls — its part's `thoughtSignature` as the
call's `extra_content.google.thought_signature`, which Gemini 3 needs back. A call without an `id`
(Gemini's own calls have none) gets one from its place (`call_<turn>_<part>`), and the response
that answers it — the next of that name, unless it names the id — the same one.
`tools[].functionDeclarations` become function tools (`parametersJsonSchema` as given;
`parameters`, Gemini's OpenAPI-style schema, as JSON Schema), `toolConfig.functionCallingConfig`
the `tool_choice` (`ANY` with `allowedFunctionNames` keeps only those tools), and
`generationConfig` its chat parameters (`temperature`, `topP`, `topK`, `maxOutputTokens`,
`stopSequences`, `seed`, the penalties; `responseMimeType` `application/json` with
`responseJsonSchema` or `responseSchema` as a `response_format`).

Liberal in: proto3 JSON names — camelCase or the proto's snake_case — are both read, and every
other field (`safetySettings`, `thinkingConfig`, a thought, a signature on a part that is not a
function call, a built-in tool such as `googleSearch`, a field invented tomorrow) is dropped and
named in `dropped`. Refused, naming the field: only what can not be carried and whose loss would
change the question — a document or audio (`inlineData` that is not an image), `cachedContent` (a
prompt kept on Google's side).
"""

from __future__ import annotations

# lanes: pure
from collections.abc import Mapping
from typing import Any

from lanes._core.dialects.common import ChatRequest, is_int, need, spaced
from lanes._core.dialects.gemini_tools import (
    an_array,
    an_object,
    field,
    json_schema,
    others,
    signed,
    tool_config,
    tools_of,
)
from lanes._core.freetier.prices import MAX_TOKENS

#: Top-level fields that are read; the others are dropped (and named).
TRANSLATED = {"contents", "systemInstruction", "tools", "toolConfig", "generationConfig"}
#: `generationConfig` fields → the chat parameter each becomes, and the type it must have.
_NUMBERS = {"temperature": "temperature", "topP": "top_p"}
_PENALTIES = {"presencePenalty": "presence_penalty", "frequencyPenalty": "frequency_penalty"}
_INTEGERS = {"topK": "top_k", "seed": "seed"}
_ROLES = {"user": "user", "function": "user", "model": "model"}  # `function`: the old name


def to_chat(body: Mapping[str, Any], *, model: str, stream: bool) -> ChatRequest:
    """The chat request for a Gemini API body asking `model`. Raises `BadField` naming what it can
    not carry."""
    need(bool(model), "model: the path must name a model (models/{model}:method)", "model")
    need(
        field(body, "cachedContent") is None,
        "cachedContent: content cached on Google's side can not be sent to another provider; "
        "send the contents themselves",
        "cachedContent",
    )
    dropped = others("", body, TRANSLATED)
    messages = _system(field(body, "systemInstruction"), dropped)
    messages += _contents(field(body, "contents"), dropped)
    need(
        any(m["role"] != "system" for m in messages),
        "contents: must hold a part lanes can send (text, an image, a function call or response)",
        "contents",
    )
    params = _generation(field(body, "generationConfig"), dropped)
    tools = tools_of(field(body, "tools"), dropped)
    if tools:
        params |= tool_config(field(body, "toolConfig"), tools, dropped)
    elif field(body, "toolConfig") is not None:  # chat refuses a tool_choice without tools
        dropped.append("toolConfig")
    return ChatRequest(
        model=model,
        messages=messages,
        params=params,
        stream=stream,
        dropped=tuple(dict.fromkeys(dropped)),
    )


def thoughts(body: Mapping[str, Any]) -> bool:
    """Whether the request asks for the model's thoughts (`thinkingConfig.includeThoughts`)."""
    config = field(body, "generationConfig")
    thinking = field(config, "thinkingConfig") if isinstance(config, Mapping) else None
    return isinstance(thinking, Mapping) and field(thinking, "includeThoughts") is True


# -- the conversation ------------------------------------------------------------------------------


def _system(system: Any, dropped: list[str]) -> list[dict[str, Any]]:
    """`systemInstruction` (a Content, or — liberal — a string) as a system message."""
    if system is None or system == "":
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}]
    content = an_object(system, "systemInstruction")
    dropped += others("systemInstruction", content, {"parts", "role"})
    texts = []
    for j, part in enumerate(an_array(field(content, "parts") or [], "systemInstruction.parts")):
        where = f"systemInstruction.parts[{j}]"
        text = field(an_object(part, where), "text")
        need(isinstance(text, str), f"{where}.text: must be a string (only text)", f"{where}.text")
        texts.append(text)
    return [{"role": "system", "content": "\n".join(texts)}] if texts else []


class _CallIds:
    """The tool-call ids of a conversation: each call's own or one from its place, and for each
    response the id of the call it answers."""

    def __init__(self) -> None:
        self._open: dict[str, list[str]] = {}  # name → ids of calls not yet answered, in order

    def called(self, call: Mapping[str, Any], turn: int, part: int) -> str:
        given = field(call, "id")
        call_id = given if isinstance(given, str) and given else f"call_{turn}_{part}"
        self._open.setdefault(str(field(call, "name")), []).append(call_id)
        return call_id

    def answered(self, response: Mapping[str, Any], turn: int, part: int) -> str:
        open_ = self._open.get(str(field(response, "name")), [])
        given = field(response, "id")
        if isinstance(given, str) and given:
            if given in open_:
                open_.remove(given)
            return given
        return open_.pop(0) if open_ else f"call_{turn}_{part}"


def _contents(contents: Any, dropped: list[str]) -> list[dict[str, Any]]:
    need(
        isinstance(contents, list) and bool(contents),
        "contents: must be a non-empty array",
        "contents",
    )
    out: list[dict[str, Any]] = []
    calls = _CallIds()
    for i, content in enumerate(contents):
        where = f"contents[{i}]"
        content = an_object(content, where)
        dropped += others("contents", content, {"parts", "role"})
        role = field(content, "role") or "user"
        need(role in _ROLES, f"{where}.role: must be user or model", f"{where}.role")
        parts = an_array(field(content, "parts"), f"{where}.parts")
        if _ROLES[role] == "model":
            out += _model_turn(parts, where, i, calls, dropped)
        else:
            out += _user_turn(parts, where, i, calls, dropped)
    return out


#: What a part holds besides its data: noted when dropped, never refused.
_PART_READ = ("text", "inlineData", "fileData", "functionCall", "functionResponse")


def _part(part: Any, where: str, dropped: list[str]) -> tuple[str, Any]:
    """(kind, value) of one part: its data field (`text`, `inlineData`, …), or ("", None) for a
    part with none lanes carries (a thought, `executableCode`, …): dropped and named. A function
    call's value is the part (its signature is beside the call)."""
    part = an_object(part, where)
    called = field(part, "functionCall") is not None and field(part, "thought") is not True
    read = {*_PART_READ, "thought", *(("thoughtSignature",) if called else ())}
    dropped += others("contents.parts", part, read)
    if field(part, "thought") is True:
        dropped.append("contents.parts.thought")
        return "", None
    for kind in _PART_READ:
        value = field(part, kind)
        if value is not None:
            return kind, (part if kind == "functionCall" else value)
    return "", None


def _model_turn(
    parts: list[Any], where: str, turn: int, calls: _CallIds, dropped: list[str]
) -> list[dict[str, Any]]:
    texts, tool_calls = [], []
    for j, part in enumerate(parts):
        at = f"{where}.parts[{j}]"
        kind, value = _part(part, at, dropped)
        if kind == "text":
            texts.append(_text(value, at))
        elif kind == "functionCall":
            tool_calls.append(_function_call(value, at, turn, j, calls, dropped))
        elif kind:
            dropped.append(f"contents.parts.{kind}")  # chat has no place for it in a reply
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    elif message["content"] is None:
        message["content"] = ""
    return [message]


def _user_turn(
    parts: list[Any], where: str, turn: int, calls: _CallIds, dropped: list[str]
) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    content: list[dict[str, Any]] = []
    for j, part in enumerate(parts):
        at = f"{where}.parts[{j}]"
        kind, value = _part(part, at, dropped)
        if kind == "text":
            content.append({"type": "text", "text": _text(value, at)})
        elif kind in ("inlineData", "fileData"):
            content.append(_image(kind, an_object(value, f"{at}.{kind}"), f"{at}.{kind}"))
        elif kind == "functionResponse":
            response = an_object(value, f"{at}.functionResponse")
            results.append(_function_response(response, at, turn, j, calls, dropped))
        elif kind:
            dropped.append(f"contents.parts.{kind}")
    if not content:
        return results
    if all(p["type"] == "text" for p in content):
        return [*results, {"role": "user", "content": "".join(p["text"] for p in content)}]
    return [*results, {"role": "user", "content": content}]


def _text(value: Any, where: str) -> str:
    need(isinstance(value, str), f"{where}.text: must be a string", f"{where}.text")
    return str(value)


def _image(kind: str, data: Mapping[str, Any], where: str) -> dict[str, Any]:
    """An image part as chat's `image_url`; anything else (a PDF, audio, video) is refused: the
    question would change without it."""
    mime = field(data, "mimeType")
    need(isinstance(mime, str), f"{where}.mimeType: Field required", f"{where}.mimeType")
    need(
        str(mime).startswith("image/"),
        f"{where}.mimeType: only images can be sent on ({str(mime)[:64]!r} is not one)",
        f"{where}.mimeType",
    )
    if kind == "inlineData":
        payload = field(data, "data")
        need(isinstance(payload, str), f"{where}.data: must be base64 text", f"{where}.data")
        return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{payload}"}}
    uri = field(data, "fileUri")
    need(
        isinstance(uri, str) and uri.startswith(("https://", "http://")),
        f"{where}.fileUri: must be an http(s) URL (a file uploaded to Google can not be sent on)",
        f"{where}.fileUri",
    )
    return {"type": "image_url", "image_url": {"url": uri}}


def _function_call(
    part: Mapping[str, Any], where: str, turn: int, j: int, calls: _CallIds, dropped: list[str]
) -> dict[str, Any]:
    """The chat tool call of a part holding a `functionCall`, and its `thoughtSignature`."""
    at = f"{where}.functionCall"
    call = an_object(field(part, "functionCall"), at)
    name, args = field(call, "name"), field(call, "args")
    need(isinstance(name, str) and bool(name), f"{at}.name: Field required", f"{at}.name")
    need(args is None or isinstance(args, Mapping), f"{at}.args: must be an object", f"{at}.args")
    arguments = spaced(args or {})
    call_id = calls.called(call, turn, j)
    function = {"name": name, "arguments": arguments}
    out: dict[str, Any] = {"id": call_id, "type": "function", "function": function}
    signature = field(part, "thoughtSignature")
    if isinstance(signature, str) and signature:
        out["extra_content"] = signed(signature)
    elif signature is not None:
        dropped.append("contents.parts.thoughtSignature")  # not text: nothing to carry
    return out


def _function_response(
    response: Mapping[str, Any],
    where: str,
    turn: int,
    part: int,
    calls: _CallIds,
    dropped: list[str],
) -> dict[str, Any]:
    at = f"{where}.functionResponse"
    name, result = field(response, "name"), field(response, "response")
    need(isinstance(name, str) and bool(name), f"{at}.name: Field required", f"{at}.name")
    need(
        result is None or isinstance(result, Mapping),
        f"{at}.response: must be an object",
        f"{at}.response",
    )
    dropped += others("contents.parts.functionResponse", response, {"name", "response", "id"})
    content = spaced(result or {})
    call_id = calls.answered(response, turn, part)
    return {"role": "tool", "tool_call_id": call_id, "content": content}


# -- generationConfig ------------------------------------------------------------------------------


def _generation(config: Any, dropped: list[str]) -> dict[str, Any]:
    """The chat parameters of `generationConfig`; what has none is dropped and named."""
    if config is None:
        return {}
    config = an_object(config, "generationConfig")
    read = {*_NUMBERS, *_PENALTIES, *_INTEGERS, "maxOutputTokens", "stopSequences"}
    read |= {"responseMimeType", "responseSchema", "responseJsonSchema"}
    dropped += others("generationConfig", config, read | {"candidateCount"})
    if field(config, "candidateCount") not in (None, 1):
        dropped.append("generationConfig.candidateCount")  # one candidate is answered
    params: dict[str, Any] = {}
    for name, param in (_NUMBERS | _PENALTIES).items():
        value = field(config, name)
        if value is not None:
            need(
                isinstance(value, int | float) and not isinstance(value, bool),
                f"generationConfig.{name}: must be a number",
                f"generationConfig.{name}",
            )
            params[param] = value
    for name, param in (_INTEGERS | {"maxOutputTokens": "max_tokens"}).items():
        value = field(config, name)
        if value is not None:
            where = f"generationConfig.{name}"
            need(is_int(value), f"{where}: must be an integer", where)
            need(
                name != "maxOutputTokens" or 0 < value <= MAX_TOKENS,
                f"{where}: must be a whole number in 1..{MAX_TOKENS}",
                where,
            )
            params[param] = value
    stops = field(config, "stopSequences")
    if stops:
        need(
            isinstance(stops, list) and all(isinstance(s, str) for s in stops),
            "generationConfig.stopSequences: must be an array of strings",
            "generationConfig.stopSequences",
        )
        params["stop"] = list(stops)
    response_format = _response_format(config, dropped)
    if response_format is not None:
        params["response_format"] = response_format
    return params


def _response_format(config: Mapping[str, Any], dropped: list[str]) -> dict[str, Any] | None:
    """`responseMimeType` and its schema as chat's `response_format`: JSON with a schema, JSON
    without one, or nothing (plain text); another type (`text/x.enum`) is dropped."""
    mime = field(config, "responseMimeType")
    schema = None
    for key in ("responseJsonSchema", "responseSchema"):
        if field(config, key) is not None:
            schema = json_schema(field(config, key), f"generationConfig.{key}")
            break
    if mime in (None, "text/plain"):
        if schema is not None:
            # ignored without JSON, as Google ignores it
            dropped.append("generationConfig.responseSchema")
        return None
    if mime != "application/json":
        dropped.append("generationConfig.responseMimeType")
        return None
    if schema is None:
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": "response", "schema": schema}}

"""OpenAI's Responses API ⇄ chat completions. Pure.

`to_chat(body)` turns a `POST /v1/responses` body into a chat request (input items become
messages, `instructions` a system message, function tools chat tools, `text.format` a
`response_format`, `max_output_tokens` a `max_tokens`); `response_of(...)` turns the chat completion
back into a `response` object (output items: the provider's reasoning as a reasoning item, a
message, function calls; usage). `ResponseEvents` does the same for a stream, one chunk at a time:
`response.created` … `response.reasoning_text.delta`, `response.output_text.delta`,
`response.function_call_arguments.delta` … `response.completed` — or, when the answer broke, the
in-band `error` event and `response.failed`.

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
from collections.abc import Callable, Mapping
from typing import Any

from lanes._core.dialects import responses_tools
from lanes._core.dialects.call_ids import minted, restored
from lanes._core.dialects.common import (
    BadField,
    ChatRequest,
    ChoiceReader,
    effort_of,
    first_choice,
    is_int,
    is_object,
    need,
    need_text,
    sub_keys,
    text_of,
    token_counts,
    tool_calls_of,
)
from lanes._core.freetier.prices import MAX_TOKENS
from lanes._core.upstream.shapes import reasoning_of, usage_in

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
_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


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


# -- chat completion → response ------------------------------------------------------------------


def usage_of(usage: Any) -> dict[str, Any] | None:
    """A Responses `usage` from a chat `usage` (None when there is none)."""
    if not isinstance(usage, Mapping):
        return None
    prompt, completion, cached, reasoning = token_counts(usage)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + completion,
    }


def shell(
    body: Mapping[str, Any], *, response_id: str, created_at: float, model: str, status: str
) -> dict[str, Any]:
    """The `response` object around the output: what was asked, echoed as OpenAI does."""
    text = body.get("text") if isinstance(body.get("text"), Mapping) else None
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(created_at),
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": model,
        "output": [],
        "parallel_tool_calls": bool(body.get("parallel_tool_calls", True)),
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "store": False,
        "temperature": body.get("temperature"),
        "text": text or {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": list(body.get("tools") or ()),
        "top_p": body.get("top_p"),
        "truncation": "disabled",
        "usage": None,
        "user": body.get("user"),
        "metadata": dict(body.get("metadata") or {}),
    }


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
        if status != "in_progress"
        else [],
    }


def reasoning_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    """A reasoning item with the provider's reasoning as its text (no summary: none was made)."""
    content = [{"type": "reasoning_text", "text": text}] if status != "in_progress" else []
    return {"type": "reasoning", "id": item_id, "status": status, "summary": [], "content": content}


def call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: str = "completed"
) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def _declared(item: dict[str, Any], flat_name: str, tools: responses_tools.Tools) -> None:
    """Name a call item the way its tool was declared: a namespaced tool by its namespace and
    its own name (the flat name was only for the upstream)."""
    namespace, name = tools.declared(flat_name)
    item["name"] = name
    if namespace is not None:
        item["namespace"] = namespace


def _finish(response: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
    reason = _INCOMPLETE.get(finish_reason or "")
    if reason is not None:
        response["status"] = "incomplete"
        response["incomplete_details"] = {"reason": reason}
    else:
        response["status"] = "completed"
    return response


def response_of(
    body: Mapping[str, Any],
    completion: Mapping[str, Any],
    *,
    response_id: str,
    created_at: float,
) -> dict[str, Any]:
    """The `response` object for a chat completion answering the Responses request `body`."""
    message, finish_reason = first_choice(completion)
    model = (
        completion.get("model") if isinstance(completion.get("model"), str) else body.get("model")
    )
    response = shell(
        body, response_id=response_id, created_at=created_at, model=str(model), status="completed"
    )
    if thinking := reasoning_of(message):
        response["output"].append(reasoning_item(f"rs_{response_id}", thinking))
    text = text_of(message.get("content")) or text_of(message.get("refusal"))
    if text or not message.get("tool_calls"):
        response["output"].append(message_item(f"msg_{response_id}", text))
    tools = responses_tools.naming(body.get("tools"))  # as `to_chat` read them
    for call_id, name, arguments, extra in tool_calls_of(message):
        at = len(response["output"])  # the item's output index, as a stream numbers it
        given = minted(call_id or f"call_{response_id}_{at}", extra)
        item = call_item(f"fc_{response_id}_{at}", given, name, arguments)
        _declared(item, name, tools)
        response["output"].append(item)
    response["usage"] = usage_of(usage_in(completion))
    return _finish(response, finish_reason)


# -- a stream --------------------------------------------------------------------------------------


#: The two kinds of content item a stream writes, by the reader's name for their pieces: the id's
#: prefix, how the item is built, and the events of its text (`….delta`, `….done`).
_CONTENT: dict[str, tuple[str, Callable[..., dict[str, Any]], str]] = {
    "thinking": ("rs", reasoning_item, "response.reasoning_text"),
    "text": ("msg", message_item, "response.output_text"),
}


def _logprobs(kind: str) -> dict[str, Any]:
    """What a text event carries beside its text (a message's logprobs; nothing for reasoning)."""
    return {"logprobs": []} if kind == "text" else {}


#: The request's members each `response` of a stream echoes, long in an agent's request (its tools
#: and system prompt): `ResponseEvents(written=...)` has them written once, not once per event.
_ECHOED = ("instructions", "tools")


class ResponseEvents:
    """Chat completion chunks in, Responses stream events out (sans-io: no I/O, no clock).

    `start()` once, `feed(chunk)` for each chunk, then `finish()` — or `fail(...)` when the answer
    broke. Each returns the events to send, in order, numbered by `sequence_number`.
    """

    def __init__(
        self,
        body: Mapping[str, Any],
        *,
        response_id: str,
        created_at: float,
        model: str,
        written: Callable[[Any], Any] | None = None,
    ) -> None:
        self._body = body
        self._written = written  # what stands for each echoed member in the events (see _ECHOED)
        self._echoed: dict[str, Any] | None = None
        self._id = response_id
        self._created_at = created_at
        self._model = model
        self._reader = ChoiceReader()
        self._tools = responses_tools.naming(body.get("tools"))  # as `to_chat` read them
        self._sequence = 0
        self._output: list[dict[str, Any]] = []  # items as they stand, in output order
        self._open: dict[str, dict[str, Any]] = {}  # "thinking" or "text" → its item being written
        self._calls: dict[int, dict[str, Any]] = {}  # chat tool-call index → its open item

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def _response(self, status: str) -> dict[str, Any]:
        response = shell(
            self._body,
            response_id=self._id,
            created_at=self._created_at,
            model=self._reader.model or self._model,
            status=status,
        )
        if self._written is not None:
            if self._echoed is None:  # each written once, for every event that echoes it
                self._echoed = {name: self._written(response[name]) for name in _ECHOED}
            response.update(self._echoed)
        response["output"] = [dict(item) for item in self._output]
        return response

    def start(self) -> list[dict[str, Any]]:
        response = self._response("in_progress")
        return [
            self._event("response.created", response=response),
            self._event("response.in_progress", response=response),
        ]

    def feed(self, chunk: Mapping[str, Any]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for kind, value in self._reader.read(chunk):
            if kind == "tool":
                events += self._call_delta(*value)
            else:
                events += self._content_delta(kind, value)
        return events

    def _content_delta(self, kind: str, delta: str) -> list[dict[str, Any]]:
        """A piece of reasoning or of text: into its open item, opened first (closing the other
        kind's and the calls) when there is none."""
        events: list[dict[str, Any]] = []
        if kind not in self._open:
            other = "text" if kind == "thinking" else "thinking"
            events += self._close(other) + self._close_calls() + self._begin(kind)
        item = self._open[kind]
        item["_text"] += delta
        where = {"item_id": item["id"], "output_index": item["output_index"], "content_index": 0}
        name = f"{_CONTENT[kind][2]}.delta"
        events.append(self._event(name, **where, delta=delta, **_logprobs(kind)))
        return events

    def _begin(self, kind: str) -> list[dict[str, Any]]:
        """Open an item of `kind` (a reasoning item, or a message) and its one content part."""
        prefix, make, _ = _CONTENT[kind]
        index = len(self._output)
        item_id = f"{prefix}_{self._id}" if index == 0 else f"{prefix}_{self._id}_{index}"
        item = self._open[kind] = make(item_id, "", status="in_progress")
        item["output_index"], item["_text"] = index, ""
        self._output.append(item)
        part = make(item_id, "")["content"][0]  # the part as it starts: no text yet
        where = {"item_id": item_id, "output_index": index, "content_index": 0}
        return [
            self._added(item),
            self._event("response.content_part.added", **where, part=part),
        ]

    def _call_delta(
        self,
        index: int,
        call_id: str | None,
        name: str | None,
        arguments: str,
        extra: dict[str, Any] | None,
    ) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        item = self._calls.get(index)
        if item is None:
            events += self._close("thinking") + self._close("text") + self._close_calls()
            position = len(self._output)
            item = call_item(
                f"fc_{self._id}_{position}",
                minted(call_id or f"call_{self._id}_{position}", extra),
                "",
                "",
                status="in_progress",
            )
            if name:
                _declared(item, name, self._tools)
            item["output_index"] = position
            self._calls[index] = item
            self._output.append(item)
            events.append(self._added(item))
        elif name and not item["name"]:
            _declared(item, name, self._tools)
        if arguments:
            item["arguments"] += arguments
            events.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=item["output_index"],
                    delta=arguments,
                )
            )
        return events

    def _added(self, item: Mapping[str, Any]) -> dict[str, Any]:
        return self._event(
            "response.output_item.added", output_index=item["output_index"], item=_public(item)
        )

    def _done(self, kind: str, status: str) -> tuple[int, dict[str, Any]] | None:
        """Close the open item of `kind` in the output, sending nothing: (its index, the item)."""
        item = self._open.pop(kind, None)
        if item is None:
            return None
        index = item["output_index"]
        done = _CONTENT[kind][1](item["id"], item["_text"], status=status)
        self._output[index] = {**done, "output_index": index}
        return index, done

    def _close(self, kind: str) -> list[dict[str, Any]]:
        """Close the open item of `kind`: its text done, its part done, the item done."""
        finished = self._done(kind, "completed")
        if finished is None:
            return []
        index, done = finished
        part = done["content"][0]
        where = {"item_id": done["id"], "output_index": index, "content_index": 0}
        name = f"{_CONTENT[kind][2]}.done"
        return [
            self._event(name, **where, text=part["text"], **_logprobs(kind)),
            self._event("response.content_part.done", **where, part=part),
            self._event("response.output_item.done", output_index=index, item=done),
        ]

    def _close_calls(self) -> list[dict[str, Any]]:
        events = []
        for item in self._calls.values():
            item["status"] = "completed"
            index = item["output_index"]
            events.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    name=item["name"],
                    arguments=item["arguments"],
                )
            )
            events.append(
                self._event("response.output_item.done", output_index=index, item=_public(item))
            )
        self._calls.clear()
        return events

    def finish(self, *, usage: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """The answer is complete: close what is open, then `response.completed` (or
        `response.incomplete` when the answer was cut at its token cap). An empty answer is an
        empty message, as in a whole response. `usage` counts when no chunk fed in carried one
        (the stream's usage can come in a chunk that is not passed on)."""
        events = self._close("thinking")
        events += self._begin("text") if all(i["type"] == "reasoning" for i in self._output) else []
        events += self._close("text") + self._close_calls()
        response = _finish(self._response("completed"), self._reader.finish_reason)
        response["usage"] = usage_of(self._reader.usage or usage)
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        return [*events, self._event(kind, response=_public_response(response))]

    def fail(self, code: str, message: str, *, status: int = 502) -> list[dict[str, Any]]:
        """The answer broke and could not be recovered: the in-band `error` event (`code`: the
        provider's own when it said why), then `response.failed` with what had been delivered
        (open items marked incomplete) and its error — a rate limit when `status` is 429."""
        error = self._event("error", code=code, message=message, param=None)
        self._done("thinking", "incomplete")
        self._done("text", "incomplete")
        for item in self._calls.values():
            item["status"] = "incomplete"
        self._calls.clear()
        response = self._response("failed")
        kind = "rate_limit_exceeded" if status == 429 else "server_error"
        response["error"] = {"code": kind, "message": message}
        response["usage"] = usage_of(self._reader.usage)
        return [error, self._event("response.failed", response=_public_response(response))]


def _public(item: Mapping[str, Any]) -> dict[str, Any]:
    """An output item without the translation's own bookkeeping keys."""
    return {k: v for k, v in item.items() if k not in ("output_index", "_text")}


def _public_response(response: dict[str, Any]) -> dict[str, Any]:
    response["output"] = [_public(item) for item in response["output"]]
    return response

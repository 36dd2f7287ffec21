"""A chat completion → OpenAI's Responses API answer. Pure.

`response_of(...)` turns the chat completion back into a `response` object (output items: the
provider's reasoning as a reasoning item, a message, function calls; usage), echoing what was
asked as OpenAI does; `responses_stream.py` does the same for a stream. A call is named as the
request's tools named it (`responses_tools.py`); its `extra_content` rides in the `call_id` the
client is given (`call_ids.py`). The request's way in is `responses_api.py`.
"""

from __future__ import annotations

# lanes: pure
from collections.abc import Mapping
from typing import Any

from lanes._core.dialects import responses_tools
from lanes._core.dialects.call_ids import minted
from lanes._core.dialects.common import (
    first_choice,
    text_of,
    token_counts,
    tool_calls_of,
)
from lanes._core.upstream.shapes import reasoning_of, usage_in

_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


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


def declared(item: dict[str, Any], flat_name: str, tools: responses_tools.Tools) -> None:
    """Name a call item the way its tool was declared: a namespaced tool by its namespace and
    its own name (the flat name was only for the upstream)."""
    namespace, name = tools.declared(flat_name)
    item["name"] = name
    if namespace is not None:
        item["namespace"] = namespace


def finished(response: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
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
        declared(item, name, tools)
        response["output"].append(item)
    response["usage"] = usage_of(usage_in(completion))
    return finished(response, finish_reason)

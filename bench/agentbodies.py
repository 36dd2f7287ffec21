"""The bodies `bench.agent` sends: a coding agent's turn of a given size at each door (a system
prompt, tool schemas, the history with tool calls and their results as text), and the chat request
lanes sends upstream for one (`sent_upstream`, its own translation)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

_DESCRIPTION = "Reads or edits files of the workspace; {n}. " * 3
_SCHEMA = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "description": "A path inside the workspace."},
        "options": {
            "type": "object",
            "properties": {
                "recursive": {"type": "boolean"},
                "limit": {"type": "integer", "minimum": 1, "maximum": 1000},
                "mode": {"type": "string", "enum": ["read", "write", "append"]},
            },
        },
    },
    "required": ["path"],
}
_SYSTEM = "You are a careful coding agent. Follow the repository's conventions. " * 20
_ASK, _AGAIN = "Fix the failing test in tests/test_parser.py.", "Now run the tests again."


def _result_text(n: int) -> str:
    line = f"    def parse_{n}(self, text: str) -> Node:  # returns the node of line {n}\n"
    return line * 24


def _chat(kb: int, tools: int, turns: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": _SYSTEM[: kb * 512]},
        {"role": "user", "content": _ASK},
    ]
    for n in range(turns):
        call = {"name": "tool_1", "arguments": json.dumps({"path": f"f{n}"})}
        messages += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": f"call_{n}", "type": "function", "function": call}],
            },
            {"role": "tool", "tool_call_id": f"call_{n}", "content": _result_text(n)},
        ]
    messages.append({"role": "user", "content": _AGAIN})
    schemas = [
        {
            "type": "function",
            "function": {
                "name": f"tool_{n}",
                "description": _DESCRIPTION.format(n=n),
                "parameters": _SCHEMA,
            },
        }
        for n in range(tools)
    ]
    return {"messages": messages, "tools": schemas, "temperature": 0, "max_tokens": 8192}


def _messages(kb: int, tools: int, turns: int) -> dict[str, Any]:
    """The Messages API's shape, as Claude Code sends a turn."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": _ASK}]
    for n in range(turns):
        use = {"type": "tool_use", "id": f"toolu_{n}", "name": "tool_1", "input": {"path": f"f{n}"}}
        result = {"type": "tool_result", "tool_use_id": f"toolu_{n}", "content": _result_text(n)}
        messages += [
            {"role": "assistant", "content": [use]},
            {"role": "user", "content": [result]},
        ]
    last = messages[-1]["content"]
    again = {"type": "text", "text": _AGAIN}
    messages[-1]["content"] = [*last, again] if isinstance(last, list) else [again]
    schemas = [
        {"name": f"tool_{n}", "description": _DESCRIPTION.format(n=n), "input_schema": _SCHEMA}
        for n in range(tools)
    ]
    return {
        "system": _SYSTEM[: kb * 512],
        "messages": messages,
        "tools": schemas,
        "temperature": 0,
        "max_tokens": 8192,
    }


def _responses(kb: int, tools: int, turns: int) -> dict[str, Any]:
    """The Responses API's shape, as Codex sends a turn."""
    items: list[dict[str, Any]] = [{"role": "user", "content": _ASK}]
    for n in range(turns):
        items += [
            {
                "type": "function_call",
                "call_id": f"call_{n}",
                "name": "tool_1",
                "arguments": json.dumps({"path": f"f{n}"}),
            },
            {"type": "function_call_output", "call_id": f"call_{n}", "output": _result_text(n)},
        ]
    items.append({"role": "user", "content": _AGAIN})
    schemas = [
        {
            "type": "function",
            "name": f"tool_{n}",
            "description": _DESCRIPTION.format(n=n),
            "parameters": _SCHEMA,
        }
        for n in range(tools)
    ]
    return {
        "instructions": _SYSTEM[: kb * 512],
        "input": items,
        "tools": schemas,
        "temperature": 0,
        "max_output_tokens": 8192,
    }


SHAPES: dict[str, Callable[[int, int, int], dict[str, Any]]] = {
    "chat": _chat,
    "messages": _messages,
    "responses": _responses,
}


def agent_body(kb: int, door: str = "chat", model: str = "fast") -> dict[str, Any]:
    """A request to `door` shaped like a coding agent's turn, about `kb` KB as JSON: a system
    prompt, up to 40 tools, then tool calls and their results until the size is reached."""
    tools, shape = min(40, kb * 2 + 1), SHAPES[door]
    turns = 0
    while len(json.dumps(shape(kb, tools, turns + 1))) < kb * 1024:
        turns += 1
    return {"model": model, **shape(kb, tools, turns)}


def sent_upstream(door: str, body: dict[str, Any], kind: str) -> dict[str, Any]:
    """The chat request lanes sends upstream for `body` at `door` (its own translation) through
    the bench's free lane: what `direct` is timed on too, so that lanes' added latency at a
    translated door is its own, not the upstream's time on another request (the fake answers
    the untranslated body a short text, and lanes' translation a tool call)."""
    from lanes._http.doors import MESSAGES, RESPONSES, translated_job  # lanes' own translation

    api = MESSAGES if door == "messages" else RESPONSES
    job, _ = translated_job(api, body, "bench", {})
    return job.body(str(body["model"]), stream=kind == "sse")

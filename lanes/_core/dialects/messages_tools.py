"""The Messages API's tools (`tools`, `tool_choice`) as chat completions' function tools. Pure.

Client tools become function tools; a server tool (`web_search_20250305`, `bash_…`,
`code_execution_…`, …) is dropped, unless `tool_choice` forces it (refused: its loss would change
what was asked). `tool_choice` (`auto`, `any`, `tool`, `none`) becomes its chat counterpart, and
`disable_parallel_tool_use` chat's `parallel_tool_calls`.
"""

from __future__ import annotations

# lanes: pure
from collections.abc import Mapping
from typing import Any

from lanes._core.dialects.common import BadField, need, need_text

_CHOICES = {"auto": "auto", "any": "required", "none": "none"}  # tool_choice.type → chat's


def tools_of(tools: Any, choice: Any, dropped: list[str]) -> list[dict[str, Any]]:
    """Client tools as chat function tools. A server tool (`web_search_20250305`, `bash_…`,
    `code_execution_…`, …) is dropped — chat completions call client tools only — unless
    `choice` names it: then its loss would change what was asked, and it is refused."""
    if tools is None:
        return []
    need(isinstance(tools, list), "tools: must be an array", "tools")
    forced = (
        choice.get("name") if isinstance(choice, Mapping) and choice.get("type") == "tool" else None
    )
    out = []
    for i, tool in enumerate(tools):
        param = f"tools.{i}"
        need(isinstance(tool, Mapping), f"{param}: must be an object", param)
        kind = tool.get("type")
        if kind not in (None, "custom"):
            need(
                forced is None or tool.get("name") != forced,
                f"tool_choice.name: names the {str(kind)[:64]!r} tool, which lanes can not offer: "
                "chat completions call client tools only",
                "tool_choice.name",
            )
            dropped.append(f"tools.{kind}")
            continue
        name, schema = tool.get("name"), tool.get("input_schema")
        need(isinstance(name, str) and bool(name), f"{param}.name: Field required", f"{param}.name")
        need(
            isinstance(schema, Mapping),
            f"{param}.input_schema: Field required",
            f"{param}.input_schema",
        )
        function: dict[str, Any] = {"name": name, "parameters": dict(schema)}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def tool_choice_of(choice: Any) -> tuple[Any, bool | None]:
    """(chat tool_choice, parallel tool calls allowed — None when not said)."""
    need(isinstance(choice, Mapping), "tool_choice: must be an object", "tool_choice")
    kind = choice.get("type")
    parallel = (
        None
        if choice.get("disable_parallel_tool_use") is None
        else not choice["disable_parallel_tool_use"]
    )
    if kind in _CHOICES:
        return _CHOICES[kind], parallel
    if kind == "tool":
        name = need_text(choice.get("name"), "tool_choice.name: Field required", "tool_choice.name")
        return {"type": "function", "function": {"name": name}}, parallel
    raise BadField("tool_choice.type: must be auto, any, tool or none", "tool_choice.type")

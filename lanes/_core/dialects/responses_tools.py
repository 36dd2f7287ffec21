"""The Responses API's tools ⇄ chat completions' function tools. Pure.

- A `function` tool is a chat function tool.
- A `namespace` tool (Codex groups its agent and MCP tools so: `{"type": "namespace", "name":
  "multi_agent_v1", "tools": [...functions]}`) becomes its member functions, each under a flat
  name chat can carry — its own name when no other tool has it, else the namespace's name joined
  to it (`mcp__docs__search`). The call a client gets back names the tool the way it declared it:
  `{"type": "function_call", "namespace": "multi_agent_v1", "name": "spawn_agent", …}`, as Codex
  routes calls by (namespace, name); a `function_call` fed back in `input` is flattened the same
  way, so the conversation reads one name throughout.
- Any other tool (`web_search`, `file_search`, `computer_use_preview`, `code_interpreter`,
  `image_generation`, `local_shell`, `custom`, …) is one lanes can not offer — chat completions
  call functions only — and is dropped (named in `dropped` by its type), unless `tool_choice`
  forces it: then the request is refused, as its loss would change what was asked. A hosted
  `mcp` tool (the provider would call the MCP server) is refused too.
"""

from __future__ import annotations

# lanes: pure
import hashlib
import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

import attrs

from lanes._core.dialects.common import BadField, is_object, need, need_text

MAX_CHAT_NAME = 64  # chat's function names: `[A-Za-z0-9_-]{1,64}`
_CHAT_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: Tools whose provider-side runs lanes can not stand in for, and whose loss would change what was
#: asked: the request is refused, naming the tool.
REFUSED = {"mcp": "the provider would call the MCP server; declare its tools as functions"}
_Function = tuple[str, str | None, Mapping[str, Any]]


@attrs.frozen(kw_only=True)
class Tools:
    """A request's tools, translated: the chat tools, each namespaced tool's flat name, and what
    was dropped."""

    chat: list[dict[str, Any]] = attrs.field(factory=list)
    flat: dict[tuple[str, str], str] = attrs.field(factory=dict)  # (namespace, name) → flat name
    dropped: list[str] = attrs.field(factory=list)

    def declared(self, flat_name: str) -> tuple[str | None, str]:
        """(namespace or None, name) of the tool the client declared as `flat_name`."""
        for (namespace, name), flat in self.flat.items():
            if flat == flat_name:
                return namespace, name
        return None, flat_name

    def flat_name(self, namespace: Any, name: str) -> str:
        """The name a call of `namespace`'s `name` goes by upstream (without one: `name`)."""
        if not isinstance(namespace, str) or not namespace:
            return name
        return self.flat.get((namespace, name), _joined(namespace, name))


def _joined(namespace: str, name: str) -> str:
    return _fit(f"{namespace}{'' if namespace.endswith('_') else '__'}{name}")


def _fit(name: str) -> str:
    """`name` as chat's function names must be (`[A-Za-z0-9_-]{1,64}`, which OpenAI and Groq
    enforce): itself when it is; else its other characters as `_`, and past 64 its first 55 and
    8 hex digits of its SHA-256 — so two long names stay two. The client never sees it: a call
    comes back under the name it declared (`Tools.flat`)."""
    if _CHAT_NAME.fullmatch(name):
        return name
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", name) or "_"
    if len(safe) <= MAX_CHAT_NAME:
        return safe
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{safe[: MAX_CHAT_NAME - 9]}_{digest}"


def _function(tool: Mapping[str, Any], param: str, name: str | None = None) -> dict[str, Any]:
    declared = need_text(tool.get("name"), f"{param}.name must be a string", f"{param}.name")
    function: dict[str, Any] = {"name": name or declared}
    for key in ("description", "parameters", "strict"):
        if tool.get(key) is not None:
            function[key] = tool[key]
    return {"type": "function", "function": function}


def _namespace(
    tool: Mapping[str, Any], param: str, functions: list[_Function], dropped: list[str]
) -> None:
    """Sort a namespace's members onto `functions` and `dropped`. Raises `BadField` if malformed."""
    name, members = tool.get("name"), tool.get("tools")
    need(isinstance(name, str) and bool(name), f"{param}.name must be a string", f"{param}.name")
    need(isinstance(members, list), f"{param}.tools must be an array", f"{param}.tools")
    for j, member in enumerate(members or ()):
        need(isinstance(member, Mapping), f"{param}.tools[{j}] must be an object", param)
        if member.get("type", "function") == "function":
            functions.append((f"{param}.tools[{j}]", name, member))
        else:
            dropped.append(f"tools.namespace.{member.get('type')}")


def translate(tools: Any) -> Tools:
    """The chat tools for a Responses `tools` array (None: no tools). Raises `BadField` for a
    malformed or a refused tool. (A `tool_choice` forcing a dropped one is refused by
    `tool_choice`.)"""
    if tools is None:
        return Tools()
    need(isinstance(tools, list), "'tools' must be an array", "tools")
    functions: list[_Function] = []  # (param, namespace, tool)
    dropped: list[str] = []
    for i, tool in enumerate(tools):
        param = f"tools[{i}]"
        need(isinstance(tool, Mapping), f"{param} must be an object", param)
        kind = tool.get("type")
        if kind == "function":
            functions.append((param, None, tool))
        elif kind == "namespace":
            _namespace(tool, param, functions, dropped)
        elif isinstance(kind, str) and kind in REFUSED:
            raise BadField(
                f"{param}.type {kind!r} is not supported: {REFUSED[kind]}", f"{param}.type"
            )
        else:
            dropped.append(f"tools.{kind}")
    bare = Counter(str(tool.get("name")) for _, _, tool in functions)
    taken = {str(tool.get("name")) for _, namespace, tool in functions if namespace is None}
    translated = Tools(dropped=dropped)
    suffixes: dict[str, int] = {}  # a flat name taken → the next suffix to try after it
    for param, namespace, tool in functions:
        if namespace is None:
            translated.chat.append(_function(tool, param))
            continue
        name = str(tool.get("name"))
        flat = base = name if bare[name] == 1 else _joined(namespace, name)
        while flat in taken:  # a tool of that very name exists: never two tools of one name —
            suffixes[base] = suffixes.get(base, 0) + 1  # a counter, not one `_` more per clash
            flat = _fit(f"{base}_{suffixes[base]}")  # (names of the clash count, cubic time)
        taken.add(flat)
        translated.flat[(namespace, name)] = flat
        translated.chat.append(_function(tool, param, flat))
    return translated


def naming(tools: Any) -> Tools:
    """What `Tools.declared` needs to name a call as its tool was declared, for tools `translate`
    took already: their translation when one is a namespace, else none (only a namespace's members
    go upstream under another name; 40 tools translated again cost 65 µs)."""
    if isinstance(tools, list) and any(
        is_object(tool) and tool.get("type") == "namespace" for tool in tools
    ):
        return translate(tools)
    return Tools()


def tool_choice(choice: Any, tools: Tools) -> Any:
    """The chat `tool_choice` for a Responses one. Raises `BadField` for a choice chat can not
    carry (a built-in tool, `allowed_tools`) or a required call when no tool is left."""
    if choice in ("auto", "none"):
        return choice
    if choice == "required":
        need(
            bool(tools.chat),
            "tool_choice 'required' needs a function tool, and none of the given tools is one "
            "lanes can offer",
            "tool_choice",
        )
        return choice
    if isinstance(choice, Mapping) and choice.get("type") == "function":
        name = need_text(
            choice.get("name"), "tool_choice.name must be a string", "tool_choice.name"
        )
        return {
            "type": "function",
            "function": {"name": tools.flat_name(choice.get("namespace"), name)},
        }
    kind = choice.get("type") if isinstance(choice, Mapping) else None
    forced = (
        f"forces {kind!r}, which lanes can not offer" if isinstance(kind, str) else "is unknown"
    )
    raise BadField(
        f"tool_choice {forced[:80]}: it must be auto, none, required or {{type: function, name}} "
        "(chat completions call function tools only)",
        "tool_choice",
    )

"""Gemini's API: how its fields are named and read (proto3 JSON: camelCase, or the proto's
snake_case), its function declarations and tool config as chat's `tools` and `tool_choice`, its
OpenAPI-style `Schema` as JSON Schema, and a function call's `thoughtSignature` as the chat tool
call's `extra_content`. Pure; used by `gemini_api.py` and `gemini_reply.py`."""

from __future__ import annotations

# lanes: pure
import base64
import binascii
import functools
import re
from collections.abc import Mapping
from typing import Any, cast

from lanes._core.dialects.common import need

_MODES = {"AUTO": "auto", "VALIDATED": "auto", "ANY": "required", "NONE": "none"}
_CAMEL = re.compile(r"_([a-z0-9])")


@functools.cache
def camel(name: str) -> str:
    """A field's lowerCamelCase name (proto3 JSON accepts the snake_case one too)."""
    return _CAMEL.sub(lambda m: m.group(1).upper(), name)


def field(value: Mapping[str, Any], name: str) -> Any:
    """`value[name]`, the field named in camelCase or in snake_case; None when absent."""
    found = value.get(name)
    if found is None:
        for key in value:
            if key != name and camel(key) == name:
                return value[key]
    return found


def others(where: str, value: Mapping[str, Any], read: set[str]) -> list[str]:
    """The fields of `value` other than those `read` (by camelCase name), as `where.field`."""
    prefix = f"{where}." if where else ""
    return [f"{prefix}{camel(key)}" for key in value if camel(key) not in read]


def an_object(value: Any, where: str) -> Mapping[str, Any]:
    need(isinstance(value, Mapping), f"{where}: must be an object", where)
    return cast("Mapping[str, Any]", value)


def an_array(value: Any, where: str) -> list[Any]:
    need(isinstance(value, list), f"{where}: must be an array", where)
    return cast("list[Any]", value)


# -- tools -----------------------------------------------------------------------------------------


def tools_of(tools: Any, dropped: list[str]) -> list[dict[str, Any]]:
    """Each function declaration as a chat function tool; a built-in tool (`googleSearch`,
    `codeExecution`, …) is dropped: chat completions call client tools only."""
    if tools is None:
        return []
    out = []
    for i, tool in enumerate(an_array(tools, "tools")):
        tool = an_object(tool, f"tools[{i}]")
        dropped += others("tools", tool, {"functionDeclarations"})
        declared = field(tool, "functionDeclarations") or []
        for j, declaration in enumerate(an_array(declared, f"tools[{i}].functionDeclarations")):
            where = f"tools[{i}].functionDeclarations[{j}]"
            out.append(_function(an_object(declaration, where), where, dropped))
    return out


def _function(declaration: Mapping[str, Any], where: str, dropped: list[str]) -> dict[str, Any]:
    name = field(declaration, "name")
    need(isinstance(name, str) and bool(name), f"{where}.name: Field required", f"{where}.name")
    read = {"name", "description", "parameters", "parametersJsonSchema"}
    dropped += others("tools.functionDeclarations", declaration, read)
    schema: dict[str, Any] = {"type": "object", "properties": {}}
    for key in ("parametersJsonSchema", "parameters"):
        if field(declaration, key) is not None:
            schema = json_schema(field(declaration, key), f"{where}.{key}")
            break
    function: dict[str, Any] = {"name": name, "parameters": schema}
    if isinstance(field(declaration, "description"), str):
        function["description"] = field(declaration, "description")
    return {"type": "function", "function": function}


#: Schema keywords that hold schemas: by name, in a list, or one (Gemini's `defs` is `$defs`).
_SCHEMA_MAPS = {"properties", "defs", "$defs", "definitions", "patternProperties"}
_SCHEMA_LISTS = {"anyOf", "oneOf", "allOf", "prefixItems"}
_SCHEMA_ONE = {"items", "additionalProperties", "not"}
#: Gemini's integer keywords, which proto3 JSON may write as strings ("int64").
_SCHEMA_INTS = {"minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties"}


def json_schema(schema: Any, where: str) -> dict[str, Any]:
    """A function's or an answer's schema as JSON Schema — whether it came as Gemini's
    OpenAPI-style `Schema` (`parameters`, `responseSchema`) or as JSON Schema that Gemini's
    clients write with Gemini's types (`parametersJsonSchema: {"type": "OBJECT"}`, as Gemini CLI
    sends it, and Gemini accepts): `type` in lower case, `nullable` as a `null` type, int64
    counts as numbers, `propertyOrdering` left out (no meaning upstream); every other keyword as
    it is. Its depth is bounded where the body was read."""
    out: dict[str, Any] = _schema(an_object(schema, where), where)
    return out


def _schema(schema: Any, where: str) -> Any:
    if not isinstance(schema, Mapping):
        return schema  # `true`, `false`: JSON Schema's own; anything else, the upstream's to judge
    out: dict[str, Any] = {}
    for key, value in schema.items():
        name = camel(key)
        out[name if name != "defs" else "$defs"] = _keyword(name, value, f"{where}.{name}")
    out.pop("nullable", None)
    out.pop("propertyOrdering", None)
    if schema.get("nullable") is True and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


def _keyword(name: str, value: Any, where: str) -> Any:
    """One keyword's value, its schemas converted."""
    if name == "type" and isinstance(value, str):
        return value.lower()
    if name == "type" and isinstance(value, list):
        return [v.lower() if isinstance(v, str) else v for v in value]
    if name in _SCHEMA_MAPS and isinstance(value, Mapping):
        return {k: _schema(v, f"{where}.{k}") for k, v in value.items()}
    if (name in _SCHEMA_LISTS or name == "items") and isinstance(value, list):
        return [_schema(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if name in _SCHEMA_ONE:
        return _schema(value, where)
    if name in _SCHEMA_INTS and isinstance(value, str) and value.isdigit():
        return int(value)
    return value


def tool_config(config: Any, tools: list[dict[str, Any]], dropped: list[str]) -> dict[str, Any]:
    """The chat `tool_choice` (and `tools`, when `allowedFunctionNames` narrows them) of
    `toolConfig.functionCallingConfig`; its other fields are dropped."""
    params: dict[str, Any] = {"tools": tools}
    if config is None:
        return params
    config = an_object(config, "toolConfig")
    dropped += others("toolConfig", config, {"functionCallingConfig"})
    calling = field(config, "functionCallingConfig")
    if calling is None:
        return params
    calling = an_object(calling, "toolConfig.functionCallingConfig")
    where = "toolConfig.functionCallingConfig"
    dropped += others(where, calling, {"mode", "allowedFunctionNames"})
    mode = field(calling, "mode") or "AUTO"
    need(
        mode in _MODES or mode == "MODE_UNSPECIFIED",
        f"{where}.mode: must be AUTO, ANY, NONE or VALIDATED",
        f"{where}.mode",
    )
    choice = _MODES.get(mode, "auto")
    allowed = field(calling, "allowedFunctionNames")
    if allowed and choice == "required":
        names = set(an_array(allowed, f"{where}.allowedFunctionNames"))
        kept = [t for t in tools if t["function"]["name"] in names]
        need(
            bool(kept),
            f"{where}.allowedFunctionNames: names none of the declared functions",
            f"{where}.allowedFunctionNames",
        )
        params["tools"] = kept
        if len(kept) == 1:
            named = {"type": "function", "function": {"name": kept[0]["function"]["name"]}}
            return params | {"tool_choice": named}
    return params | {"tool_choice": choice}


# -- thought signatures ----------------------------------------------------------------------------


def thought_signature(extra: Any) -> str | None:
    """The thought signature in a chat tool call's `extra_content` (as Gemini's OpenAI-compatible
    endpoint puts it: `{"google": {"thought_signature": …}}`), or None."""
    google = extra.get("google") if isinstance(extra, Mapping) else None
    signature = google.get("thought_signature") if isinstance(google, Mapping) else None
    return signature if isinstance(signature, str) and signature else None


def signed(signature: str) -> dict[str, Any]:
    """The `extra_content` that carries a function call's `thoughtSignature` upstream: the bytes
    it encodes in standard, padded base64, as Gemini's OpenAI-compatible endpoint wrote them
    (google-genai sends the bytes back in the URL-safe alphabet); as it came when it is not
    base64."""
    try:
        raw = base64.b64decode(
            signature.replace("-", "+").replace("_", "/") + "=" * (-len(signature) % 4),
            validate=True,
        )
    except (binascii.Error, ValueError):
        raw = None
    standard = base64.b64encode(raw).decode("ascii") if raw else signature
    return {"google": {"thought_signature": standard}}

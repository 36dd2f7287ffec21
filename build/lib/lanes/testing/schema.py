"""A JSON value valid against a JSON schema: what the simulated providers answer for
`response_format: json_schema` and for a tool call's arguments. Pure.

Deterministic: the same schema always gives the same value. Strings are the property's name
("setup", "punchline") when nothing constrains them, so an answer reads sensibly. Supported: `type`
(and lists of types), `properties`, `required`, `additionalProperties`, `items`, `prefixItems`,
`minItems`/`maxItems`, `uniqueItems`, `minProperties`, `enum`, `const`, `anyOf`/`oneOf`/`allOf`,
`$ref` into `$defs`/`definitions`, `minimum`/`maximum` (and exclusive), `multipleOf`,
`minLength`/`maxLength`, common `format`s, and a `pattern` matched by one of a few usual strings.

Numbers are whole where they can be: an `integer` is a JSON integer, and so is a `number` whose
value is whole (`0`, not `0.0`) — valid against `number` in every draft, read by a float parser
as a float, and by a client that expects a count (`max_output_tokens`, `yield_time_ms`, an id: a
Rust `usize`, Codex's) as the count it is. Only a bound or `multipleOf` that needs a fraction
gives one (`minimum: 0.5` → `0.5`).
"""

from __future__ import annotations

# lanes: pure
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

#: Beyond this depth only required properties (and minItems items) are produced, so a recursive
#: schema ends.
MAX_DEPTH = 4
FORMATS = {
    "date-time": "2026-01-01T00:00:00Z",
    "date": "2026-01-01",
    "time": "00:00:00Z",
    "email": "someone@example.com",
    "uri": "https://example.com/",
    "url": "https://example.com/",
    "uuid": "00000000-0000-4000-8000-000000000000",
    "ipv4": "127.0.0.1",
    "ipv6": "::1",
    "hostname": "example.com",
    "duration": "P1D",
}
_PATTERN_TRIES = ("sample", "a", "A", "0", "a1", "abc", "ABC", "123", "a-b", "a_b", "x@y.z", "")


def instance(schema: Any, *, name: str = "value") -> Any:
    """A value valid against `schema` (a JSON schema as parsed JSON). Never raises: an unreadable
    schema gives a string."""
    return _value(schema, root=schema if isinstance(schema, Mapping) else {}, name=name, depth=0)


def _resolve(schema: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    seen = 0
    while isinstance(schema.get("$ref"), str) and seen < 32:
        ref: str = schema["$ref"]
        target: Any = root
        if ref != "#":
            for part in ref.removeprefix("#/").split("/"):
                part = part.replace("~1", "/").replace("~0", "~")
                target = target.get(part) if isinstance(target, Mapping) else None
        if not isinstance(target, Mapping):
            return {}
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        schema = {**target, **rest}
        seen += 1
    return schema


def _merge(parts: list[Any]) -> dict[str, Any]:
    """allOf: the parts' keywords together (properties and required unioned)."""
    merged: dict[str, Any] = {}
    for part in parts:
        if not isinstance(part, Mapping):
            continue
        for key, value in part.items():
            if key == "properties" and isinstance(value, Mapping):
                merged["properties"] = {**merged.get("properties", {}), **value}
            elif key == "required" and isinstance(value, list):
                merged["required"] = [*merged.get("required", []), *value]
            else:
                merged.setdefault(key, value)
    return merged


def _value(schema: Any, *, root: Mapping[str, Any], name: str, depth: int, nth: int = 0) -> Any:
    if schema is True or not isinstance(schema, Mapping):
        return name
    schema = _resolve(schema, root)
    if "allOf" in schema and isinstance(schema["allOf"], list):
        rest = {k: v for k, v in schema.items() if k != "allOf"}
        schema = _merge([rest, *(_resolve(p, root) for p in schema["allOf"])])
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][nth % len(schema["enum"])]
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            rest = {k: v for k, v in schema.items() if k != key}
            chosen = _first_not_null([_resolve(o, root) for o in options if isinstance(o, Mapping)])
            return _value({**rest, **chosen}, root=root, name=name, depth=depth, nth=nth)
    typed: dict[str, Callable[[], Any]] = {  # by the schema's type; any other: a string
        "object": lambda: _object(schema, root=root, depth=depth, nth=nth),
        "array": lambda: _array(schema, root=root, name=name, depth=depth),
        "integer": lambda: _number(schema, integer=True, nth=nth),
        "number": lambda: _number(schema, integer=False, nth=nth),
        "boolean": lambda: nth % 2 == 0,
        "null": lambda: None,
    }
    return typed.get(_type_of(schema), lambda: _string(schema, name=name, nth=nth))()


def _first_not_null(options: list[Mapping[str, Any]]) -> Mapping[str, Any]:
    for option in options:
        if option.get("type") != "null":
            return option
    return options[0] if options else {}


def _type_of(schema: Mapping[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if isinstance(k, str)]
        kind = next((k for k in kinds if k != "null"), kinds[0] if kinds else None)
    if isinstance(kind, str):
        return kind
    if "properties" in schema or "required" in schema or "additionalProperties" in schema:
        return "object"
    if "items" in schema or "prefixItems" in schema:
        return "array"
    if any(k in schema for k in ("minimum", "maximum", "multipleOf")):
        return "number"
    return "string"


def _object(
    schema: Mapping[str, Any], *, root: Mapping[str, Any], depth: int, nth: int
) -> dict[str, Any]:
    properties = schema.get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    required = [r for r in schema.get("required") or () if isinstance(r, str)]
    names = list(properties) if depth < MAX_DEPTH else []
    names += [r for r in required if r not in names]
    out = {
        key: _value(properties.get(key, {}), root=root, name=key, depth=depth + 1, nth=nth)
        for key in names
    }
    extra = schema.get("additionalProperties", True)
    wanted = schema.get("minProperties")
    count = wanted if isinstance(wanted, int) and not isinstance(wanted, bool) else 0
    while len(out) < count and extra is not False:
        key = f"key{len(out)}"
        out[key] = _value(extra, root=root, name=key, depth=depth + 1)
    return out


def _array(
    schema: Mapping[str, Any], *, root: Mapping[str, Any], name: str, depth: int
) -> list[Any]:
    prefix = schema.get("prefixItems")
    prefix = prefix if isinstance(prefix, list) else []
    items = schema.get("items", {})
    low, high = schema.get("minItems", 0), schema.get("maxItems")
    low = low if isinstance(low, int) and not isinstance(low, bool) else 0
    count = max(low, len(prefix), 1 if depth < MAX_DEPTH else 0)
    if isinstance(high, int) and not isinstance(high, bool):
        count = min(count, high)
    if items is False:
        count = min(count, len(prefix))
    out = []
    for i in range(count):
        part = prefix[i] if i < len(prefix) else items
        out.append(_value(part, root=root, name=name, depth=depth + 1, nth=i))
    return out


def _number(schema: Mapping[str, Any], *, integer: bool, nth: int) -> int | float:
    low = _bound(schema, "minimum", "exclusiveMinimum")
    high = _bound(schema, "maximum", "exclusiveMaximum")
    step = schema.get("multipleOf")
    step = step if isinstance(step, (int, float)) and not isinstance(step, bool) and step > 0 else 0

    def fits(value: float) -> bool:
        if low is not None and (value < low[0] or (low[1] and value <= low[0])):
            return False
        if high is not None and (value > high[0] or (high[1] and value >= high[0])):
            return False
        if step and (value / step) != int(value / step):  # as validators check it
            return False
        return not integer or value == int(value)

    base = low[0] if low is not None else (high[0] if high is not None else 0.0)
    tries: list[float] = []
    if step:
        k = math.ceil(base / step)
        tries += [j * step for j in (k + nth, k, k + 1, k - 1, k + 2, 0)]
    tries += [base + nth, base - nth, base, base + 1, base - 1, base + 0.5, base - 0.5, 0.0]
    if low is not None and high is not None:
        tries.append((low[0] + high[0]) / 2)
    tries = [math.ceil(t) if integer else t for t in tries]
    value = next((t for t in tries if fits(t)), tries[0])
    if integer or (float(value).is_integer() and abs(value) < 2**53):
        return int(value)  # a whole number is written whole, for `number` too
    return float(value)


def _bound(schema: Mapping[str, Any], inclusive: str, exclusive: str) -> tuple[float, bool] | None:
    """(bound, exclusive?) from draft-4 booleans or draft-6+ numbers."""
    value = schema.get(exclusive)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value), True
    bound = schema.get(inclusive)
    if isinstance(bound, (int, float)) and not isinstance(bound, bool):
        return float(bound), value is True
    return None


def _string(schema: Mapping[str, Any], *, name: str, nth: int) -> str:
    fmt = schema.get("format")
    text = FORMATS.get(fmt, name) if isinstance(fmt, str) else name
    if nth:
        text = f"{text}{nth}" if not isinstance(fmt, str) or fmt not in FORMATS else text
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        text = _matching(pattern, text)
    low, high = schema.get("minLength"), schema.get("maxLength")
    if isinstance(low, int) and not isinstance(low, bool) and len(text) < low:
        text = (text or "x") * (low // max(len(text), 1) + 1)
    if isinstance(high, int) and not isinstance(high, bool) and len(text) > high:
        text = text[:high]
    return text


def _matching(pattern: str, preferred: str) -> str:
    try:
        compiled = re.compile(pattern)
    except re.error:
        return preferred
    for candidate in (preferred, *_PATTERN_TRIES):
        if compiled.search(candidate):
            return candidate
    return preferred

"""How config values are read, and how a problem with one is said. Pure.

TOML has types, so a value must already be of the type its key takes: a boolean is `true` or
`false` (never `"false"`, which Python would read as true), a number is written without quotes, a
list is an array, a choice is one of its words. The one exception is a string that `${NAME}`
substitution produced (a `FromEnv`): the environment only holds text, so there a boolean may be
written `true/false/1/0/yes/no/on/off` (any case) and a number as its digits — anything else is
refused all the same.

Every problem becomes one line that names the key the way a person wrote it — lanes by their name
(`lanes.groq.attempt_timeout_s`), models by their id (`lanes.groq.models["llama3"].context`) —
shows the value, says the rule and the fix in plain words, and suggests the nearest key for a
misspelt one.
"""

from __future__ import annotations

# lanes: pure
import difflib
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args, get_origin

import attrs
import cattrs
from cattrs.cols import (
    homogenous_tuple_structure_factory,
    is_mapping,
    is_sequence,
    list_structure_factory,
    mapping_structure_factory,
)
from cattrs.errors import ForbiddenExtraKeysError
from cattrs.v import transform_error

TRUE_WORDS = frozenset({"true", "1", "yes", "on"})
FALSE_WORDS = frozenset({"false", "0", "no", "off"})
_INT = re.compile(r"^[+-]?\d+$")
_FLOAT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_][A-Za-z0-9_-]*)*")
_LANE_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]*")
_PATH = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]|\['((?:[^'\\]|\\.)*)'\]")


class FromEnv(str):
    """A string `${NAME}` substitution produced: it may stand for a boolean or a number."""

    __slots__ = ()


class Refused(ValueError):
    """A value of the wrong kind. The message says what was found and the fix, not the key: the
    formatter puts the key in front."""


def shown(value: Any) -> str:
    """A value as a person would write it in TOML."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:g}"
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, list):
        return "a list"
    return repr(value)


def env_flag(value: str) -> bool | None:
    """`true/false/1/0/yes/no/on/off` (any case, spaces ignored) as a boolean; None otherwise."""
    word = value.strip().lower()
    return True if word in TRUE_WORDS else False if word in FALSE_WORDS else None


def _bool(value: Any, _: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, FromEnv):
        flag = env_flag(value)
        if flag is None:
            raise Refused(
                f"{shown(value)} (from the environment) is not a yes/no value; "
                "set the variable to true or false (1/0, yes/no and on/off work too)"
            )
        return flag
    if isinstance(value, str) and (flag := env_flag(value)) is not None:
        word = "true" if flag else "false"
        raise Refused(
            f"{shown(value)} is text, not a boolean (any text would read as true); "
            f"write {word} without quotes"
        )
    raise Refused(f"{shown(value)} is not a boolean; write true or false, without quotes")


def _int(value: Any, _: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, FromEnv) and _INT.match(value.strip()):
        return int(value.strip())
    if isinstance(value, str) and _INT.match(value.strip()):
        raise Refused(f"{shown(value)} is text, not a number; write {value.strip()} without quotes")
    origin = " (from the environment)" if isinstance(value, FromEnv) else ""
    raise Refused(f"{shown(value)}{origin} is not a whole number (integer); write one such as 30")


def _float(value: Any, _: Any) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, FromEnv) and _FLOAT.match(value.strip()):
        return float(value.strip())
    if isinstance(value, str) and _FLOAT.match(value.strip()):
        raise Refused(f"{shown(value)} is text, not a number; write {value.strip()} without quotes")
    origin = " (from the environment)" if isinstance(value, FromEnv) else ""
    raise Refused(f"{shown(value)}{origin} is not a number; write one such as 2.5")


def _str(value: Any, _: Any) -> str:
    if isinstance(value, str):
        return str(value)  # a FromEnv becomes a plain string once read
    raise Refused(f"{shown(value)} is not text; write it in quotes")


def _is_literal(type_: Any) -> bool:
    return get_origin(type_) is Literal


def _literal(value: Any, type_: Any) -> Any:
    allowed = get_args(type_)
    if isinstance(value, str) and value in allowed:
        return str(value)
    words = ", ".join(shown(a) for a in allowed)
    hint = ""
    if isinstance(value, str):
        near = difflib.get_close_matches(value.lower(), [str(a) for a in allowed], n=1, cutoff=0.5)
        hint = f' — did you mean "{near[0]}"?' if near else ""
    return _refuse(f"{shown(value)} is not a choice here; use one of {words}{hint}")


def _refuse(message: str) -> Any:
    raise Refused(message)


def _sequence_factory(type_: Any, converter: cattrs.Converter) -> Any:
    inner = (
        homogenous_tuple_structure_factory(type_, converter)
        if get_origin(type_) is tuple
        else list_structure_factory(type_, converter)
    )

    def structure(value: Any, cl: Any) -> Any:
        if not isinstance(value, (list, tuple)):
            raise Refused(f'{shown(value)} is not a list; write an array, e.g. ["a", "b"]')
        return inner(value, cl)

    return structure


def _mapping_factory(type_: Any, converter: cattrs.Converter) -> Any:
    inner = mapping_structure_factory(type_, converter)

    def structure(value: Any, cl: Any) -> Any:
        if not isinstance(value, Mapping):
            raise Refused(f"{shown(value)} is not a table; write it as {{ key = value, … }}")
        return inner(value, cl)

    return structure


_SEQUENCES: tuple[Any, ...] = (list, tuple, Sequence)
_MAPPINGS: tuple[Any, ...] = (dict, Mapping)


def strict_converter() -> cattrs.Converter:
    """A cattrs converter that refuses unknown keys and values of the wrong kind."""
    converter = cattrs.Converter(forbid_extra_keys=True)
    converter.register_structure_hook(bool, _bool)
    converter.register_structure_hook(int, _int)
    converter.register_structure_hook(float, _float)
    converter.register_structure_hook(str, _str)
    converter.register_structure_hook_func(_is_literal, _literal)
    converter.register_structure_hook_factory(
        lambda t: is_sequence(t) and get_origin(t) in _SEQUENCES,
        lambda t: _sequence_factory(t, converter),
    )
    converter.register_structure_hook_factory(
        lambda t: is_mapping(t) and get_origin(t) in _MAPPINGS,
        lambda t: _mapping_factory(t, converter),
    )
    return converter


# -- saying what is wrong ------------------------------------------------------------------------


def _suggest(wrong: str, known: Sequence[str]) -> str:
    near = difflib.get_close_matches(wrong, known, n=1, cutoff=0.6)
    if near:
        return f"did you mean {near[0]}?"
    return f"the keys here are {', '.join(known)}" if known else "remove it"


def _format(exc: BaseException, type_: Any) -> str:
    if isinstance(exc, ForbiddenExtraKeysError):
        known = [f.name for f in attrs.fields(exc.cl)] if attrs.has(exc.cl) else []
        return "\n".join(
            f"{key}: unknown key; {_suggest(key, known)}" for key in sorted(exc.extra_fields)
        )
    if isinstance(exc, KeyError):
        return "required key missing; add it"
    if isinstance(exc, ValueError):
        return str(exc)  # our hooks' and validators' own words
    return f"{exc} (expected {getattr(type_, '__name__', type_)})"


def _segments(path: str) -> list[str | int]:
    return [int(index) if index else name or key for name, index, key in _PATH.findall(path)]


def key_of(segments: list[str | int], raw: Any) -> str:
    """`lanes[3].models[0].context` → `lanes.groq.models["llama3"].context`, using the file's own
    names (an entry without a name that picks it out keeps its index)."""
    parts: list[str] = []
    node, parent = raw, ""
    for segment in segments:
        if isinstance(segment, int):
            fits = isinstance(node, list) and 0 <= segment < len(node)
            item = node[segment] if fits else None
            label = _label(parent, item, node)
            if label:
                parts.append(f".{label}" if parent == "lanes" else f'["{label}"]')
            else:
                parts.append(f"[{segment}]")
        else:
            item = node.get(segment) if isinstance(node, Mapping) else None
            parts.append(f".{segment}" if _IDENT.fullmatch(segment) else f'["{segment}"]')
            parent = segment
        node = item
    return "".join(parts).lstrip(".")


def _label(parent: str, item: Any, siblings: Any) -> str:
    """A lane's name, or a model's id, when it picks out exactly one entry of its list."""
    field = {"lanes": "name", "models": "id"}.get(parent)
    if field is None or not isinstance(item, Mapping) or not isinstance(siblings, list):
        return ""
    value = item.get(field)
    if not isinstance(value, str) or not value or any(c in value for c in '"\n'):
        return ""
    if parent == "lanes" and not _LANE_NAME.fullmatch(value):
        return ""
    same = sum(1 for s in siblings if isinstance(s, Mapping) and s.get(field) == value)
    return value if same == 1 else ""


def messages(exc: Exception, raw: Any) -> list[str]:
    """One line per problem in a cattrs error, each starting with the key it is about."""
    out = []
    for line in transform_error(exc, path="$", format_exception=_format):
        text, _, path = line.rpartition(" @ ")
        for message in text.split("\n"):
            segments = _segments(path)
            head, sep, rest = message.partition(": ")
            if sep and _DOTTED.fullmatch(head):  # a validator's words start with its field's name
                segments.extend(head.split("."))
                message = rest
            key = key_of(segments, raw)
            out.append(f"{key}: {message}" if key else message)
    return out

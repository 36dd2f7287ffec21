"""Strict JSON for what comes from outside — a client's request, an upstream's answer. Pure.

Python's `json` accepts what JSON does not (`NaN`, `Infinity`, numbers that overflow to infinity),
builds strings no encoder can write back (lone surrogates such as `"\\ud800"`), and raises
`RecursionError` on deep nesting. `loads` refuses all of them with `JSONRefused` (a `ValueError`)
naming where, so what it returns can always be encoded again and walked without recursion limits.
"""

from __future__ import annotations

# lanes: pure
import json
import math
from typing import Any

MAX_DEPTH = 64  # a request nests messages, content parts and tool schemas: far below this


class JSONRefused(ValueError):
    """Not strict JSON. `where` is a path such as `messages[0].content`, or "" for the whole."""

    def __init__(self, message: str, where: str = "") -> None:
        super().__init__(f"{message} at {where}" if where else message)
        self.where = where


def _constant(name: str) -> Any:
    raise JSONRefused(f"{name} is not JSON")


def loads(raw: bytes | str, *, max_depth: int = MAX_DEPTH) -> Any:
    """Parse `raw` (UTF-8 bytes or text). Raises `JSONRefused` for invalid JSON, NaN or infinite
    numbers, lone surrogates, or nesting deeper than `max_depth`."""
    try:
        value = json.loads(raw, parse_constant=_constant)
    except RecursionError:
        raise JSONRefused(f"nested deeper than {max_depth} levels") from None
    except JSONRefused:
        raise
    except (ValueError, UnicodeDecodeError, TypeError) as exc:
        raise JSONRefused(f"not valid JSON ({str(exc)[:80]})") from None
    check(value, max_depth=max_depth)
    return value


def check(value: Any, *, max_depth: int = MAX_DEPTH) -> None:
    """Raise `JSONRefused` if `value` nests deeper than `max_depth`, or holds a non-finite number
    or a string with a lone surrogate. Iterative: no recursion limit to hit."""
    stack: list[tuple[Any, int, str]] = [(value, 0, "")]
    while stack:
        node, depth, where = stack.pop()
        if isinstance(node, dict):
            if depth >= max_depth:
                raise JSONRefused(f"nested deeper than {max_depth} levels", where)
            for key, child in node.items():
                name = key if key.isascii() else key.encode("utf-8", "backslashreplace").decode()
                path = f"{where}.{name}" if where else name
                _text(key, path)
                stack.append((child, depth + 1, path))
        elif isinstance(node, list):
            if depth >= max_depth:
                raise JSONRefused(f"nested deeper than {max_depth} levels", where)
            stack.extend((child, depth + 1, f"{where}[{i}]") for i, child in enumerate(node))
        elif isinstance(node, str):
            _text(node, where)
        elif isinstance(node, float) and not math.isfinite(node):
            raise JSONRefused("a number too large for JSON", where)


def _text(text: str, where: str) -> None:
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise JSONRefused("a string with a lone surrogate (not UTF-8)", where) from None

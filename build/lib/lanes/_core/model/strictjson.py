"""Strict JSON for what comes from outside — a client's request, an upstream's answer. Pure.

Python's `json` accepts what JSON does not (`NaN`, `Infinity`, numbers that overflow to infinity),
builds strings no encoder can write back (lone surrogates such as `"\\ud800"`), and raises
`RecursionError` on deep nesting. `loads` refuses all of them with `JSONRefused` (a `ValueError`)
naming where, so what it returns can always be encoded again and walked without recursion limits.

Most documents (every chunk of a stream, most requests) can be seen to be safe from their text
alone — fewer brackets than the depth allowed, no surrogate escape — and then only the numbers
need watching while they parse: the walk that names where a refusal is runs only for the others.
"""

from __future__ import annotations

# lanes: pure
import json
import math
import re
from typing import Any

MAX_DEPTH = 64  # a request nests messages, content parts and tool schemas: far below this
# What could make a lone surrogate: an escape of one (paired ones match too, and take the walk),
# or, in bytes, the UTF-8 form of one (json decodes bytes with surrogatepass).
_ESCAPED = re.compile(r"\\u[dD][89a-fA-F]")
_ESCAPED_BYTES = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_SURROGATE_UTF8 = re.compile(rb"\xed[\xa0-\xbf]")


class JSONRefused(ValueError):
    """Not strict JSON. `where` is a path such as `messages[0].content`, or "" for the whole."""

    def __init__(self, message: str, where: str = "") -> None:
        super().__init__(f"{message} at {where}" if where else message)
        self.where = where


def _constant(name: str) -> Any:
    raise JSONRefused(f"{name} is not JSON")


class _Overflow(Exception):
    """A number parsed to infinity: the walk will say where."""


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Overflow
    return value


_QUICK = json.JSONDecoder(parse_constant=_constant, parse_float=_finite)


def _plain(raw: bytes | str, max_depth: int) -> bool:
    """True when `raw`'s text alone shows it nests at most `max_depth` deep (each level opens a
    bracket) and can hold no lone surrogate — so that, once parsed with finite numbers, the walk
    (`check`) could find nothing."""
    # (the patterns run only where a quick search finds what they start with)
    if isinstance(raw, str):
        return (
            raw.count("[") + raw.count("{") <= max_depth
            and not ("\\u" in raw and _ESCAPED.search(raw))
            and (raw.isascii() or not _SURROGATE.search(raw))
        )
    return (
        raw.count(b"[") + raw.count(b"{") <= max_depth
        # json reads UTF-16 and UTF-32 too: only UTF-8 bytes can be judged by the patterns
        and json.detect_encoding(raw) == "utf-8"
        and not (b"\\u" in raw and _ESCAPED_BYTES.search(raw))
        and not (b"\xed" in raw and _SURROGATE_UTF8.search(raw))
    )


def loads(raw: bytes | str, *, max_depth: int = MAX_DEPTH) -> Any:
    """Parse `raw` (UTF-8 bytes or text). Raises `JSONRefused` for invalid JSON, NaN or infinite
    numbers, lone surrogates, or nesting deeper than `max_depth`."""
    if isinstance(raw, (bytes, str)) and _plain(raw, max_depth):
        # as json.loads reads it (bytes: as UTF-8, which _plain saw), with one decoder for all
        try:
            text = raw.decode("utf-8", "surrogatepass") if isinstance(raw, bytes) else raw
            if not text.startswith("\ufeff"):  # json.loads refuses a BOM: the long way says so
                return _QUICK.decode(text)
        except _Overflow:
            pass  # the walk below names where
        except JSONRefused:
            raise
        except (ValueError, UnicodeDecodeError) as exc:
            raise JSONRefused(f"not valid JSON ({str(exc)[:80]})") from None
    return _walked(raw, max_depth)


def _walked(raw: bytes | str, max_depth: int) -> Any:
    """`loads` the long way: parse, then walk everything (`check`)."""
    value = _parse(raw, max_depth)
    check(value, max_depth=max_depth)
    return value


def _parse(raw: bytes | str, max_depth: int, **hooks: Any) -> Any:
    try:
        return json.loads(raw, parse_constant=_constant, **hooks)
    except RecursionError:
        raise JSONRefused(f"nested deeper than {max_depth} levels") from None
    except JSONRefused:
        raise
    except (ValueError, UnicodeDecodeError, TypeError) as exc:
        raise JSONRefused(f"not valid JSON ({str(exc)[:80]})") from None


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

"""Strict JSON for what comes from outside — a client's request, an upstream's answer. Pure.

Python's `json` accepts what JSON does not (`NaN`, `Infinity`, numbers that overflow to infinity),
builds strings no encoder can write back (lone surrogates such as `"\\ud800"`), and raises
`RecursionError` on deep nesting. `loads` refuses all of them with `JSONRefused` (a `ValueError`)
naming where, so what it returns can always be encoded again and walked without recursion limits.

A document is read in one pass: its nesting is judged from its text (the brackets outside its
strings), and msgspec parses it — refusing what is not JSON, a number out of range, a lone
surrogate and what is not UTF-8 — with every number with a fraction or an exponent read by
Python's own `float` (as `json` reads it, and refused when not finite). Only what that pass
refuses goes the long way: `json` parses it (a byte-order mark, UTF-16, or what is refused), and
the walk that names where a refusal is runs when the text alone can not show the document safe.
Either way the value is the one `json.loads` gives (msgspec keeps integers of any size exact, and
the last of a repeated key, as `json` does).
"""

from __future__ import annotations

# lanes: pure
import json
import math
import re
import threading
from typing import Any

import attrs
import msgspec

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
_TALLY = threading.local()  # `measured`'s count of the numbers read, in the thread reading


def _counted(text: str) -> float:
    """A number with a fraction or an exponent, read by Python's `float`; what its repr adds to
    the text it was written in is tallied for `measured`."""
    value = float(text)
    if not math.isfinite(value):
        raise _Overflow
    tally: list[int] | None = getattr(_TALLY, "growth", None)
    if tally is not None:
        tally.append(len(repr(value)) - len(text))
    return value


# `loads` reads floats as `json` does and no more; only `measured` tallies them (the tally's
# look-up costs more than the float itself: an embeddings answer of 100,000 floats took 1.6x the
# time of the long way with it)
_ONE_PASS = msgspec.json.Decoder(float_hook=_finite)
_MEASURING = msgspec.json.Decoder(float_hook=_counted)
# what the one pass refuses: the long way accepts it (a BOM, UTF-16) or names where it is wrong
_PASSED_ON = (msgspec.MsgspecError, _Overflow, UnicodeError, RecursionError)
_NOT_STRUCTURE = bytes(range(256)).translate(None, b'",:[]{}')  # what `_structure` deletes
_STRING = re.compile(rb'"[^"]*"')
_ESCAPE = re.compile(rb'\\[\\"]')  # an escaped backslash or quote


def _unescaped(text: bytes) -> bytes:
    """`text` without its escaped backslashes and quotes: each run of backslashes loses its pairs,
    left to right, and a lone one left before a quote goes with it. A regex takes them in one
    pass (0.26 ms for a 512 KB agent request, against 1.0 ms for the two replaces), up to one
    per 64 bytes; a text with more (a body made of them: the regex would take 0.3 s of the event
    loop for 4 MB) has the rest taken by the replaces, which leave the same (the regex stops
    right after an escape, and what it took leaves no backslash next to a quote or another)."""
    budget = max(1, len(text) >> 6)
    text, taken = _ESCAPE.subn(b"", text, count=budget)
    if taken == budget:
        text = text.replace(b"\\\\", b"").replace(b'\\"', b"")
    return text


_SHORT = 4096  # bytes or characters


def _structure(raw: bytes | str, max_depth: int) -> int | None:
    """Judged from its text, if `raw` is JSON: how many commas and colons stand between its items
    (those in its strings counted too in a short text) — or None when it nests deeper than
    `max_depth`, by the brackets outside its strings, each pass taking the innermost pairs away
    (or when they do not pair up: it is not JSON, and the long way says so)."""
    if len(raw) <= _SHORT:  # (counting a long text's brackets costs more than the passes)
        if isinstance(raw, str):
            if raw.count("[") + raw.count("{") <= max_depth:
                return raw.count(",") + raw.count(":")
        elif raw.count(b"[") + raw.count(b"{") <= max_depth:
            return raw.count(b",") + raw.count(b":")
    text = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if b"\\" in text:  # an escaped quote or backslash is not one that ends a string
        text = _unescaped(text)
    # what is left of a string without those in it is "" (two adjacent quotes: taking away any
    # such pair leaves the other quotes alternating as before); then the rest of the strings go
    text = text.translate(None, _NOT_STRUCTURE).replace(b'""', b"")
    if b'"' in text:
        text = _STRING.sub(b"", text)
    separators = text.count(b",") + text.count(b":")
    text = text.translate(None, b",:")
    for _ in range(max_depth):
        if not text:
            return separators
        inner = text.replace(b"[]", b"\0").replace(b"{}", b"\0")  # one level, no more
        if inner == text:
            return None
        text = inner.replace(b"\0", b"")
    return None if text else separators


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


@attrs.frozen(kw_only=True)
class Measured:
    """What `measured` saw of a document read in one pass: how many numbers with a fraction or an
    exponent it holds, and how many bytes longer Python's repr writes them, in all (those it
    writes shorter count 0)."""

    floats: int = 0
    growth: int = 0
    separators: int = 0  # at least the commas and colons between its items


def measured(raw: bytes | str, *, max_depth: int = MAX_DEPTH) -> tuple[Any, Measured | None]:
    """`loads`, and what it saw of the numbers and the separators when the document was read in
    one pass (None when it went the long way)."""
    separators = _structure(raw, max_depth) if isinstance(raw, (bytes, str)) else None
    if separators is not None:
        tally: list[int] = []
        _TALLY.growth = tally
        try:
            value = _MEASURING.decode(raw)
        except _PASSED_ON:
            pass
        else:
            growth = sum(max(0, g) for g in tally)
            return value, Measured(floats=len(tally), growth=growth, separators=separators)
        finally:
            _TALLY.growth = None
    return _long_way(raw, max_depth), None


def loads(raw: bytes | str, *, max_depth: int = MAX_DEPTH) -> Any:
    """Parse `raw` (UTF-8 bytes or text). Raises `JSONRefused` for invalid JSON, NaN or infinite
    numbers, lone surrogates, or nesting deeper than `max_depth`."""
    if isinstance(raw, (bytes, str)) and _structure(raw, max_depth) is not None:
        try:
            return _ONE_PASS.decode(raw)
        except _PASSED_ON:
            pass
    return _long_way(raw, max_depth)


def _long_way(raw: bytes | str, max_depth: int) -> Any:
    """`loads` by `json`: what the one pass refused or could not judge."""
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

"""What the bytes of a request tell of it as they arrived, without encoding it again. Pure.

`Job.input_bytes` is the length of a chat's messages and tools as `json.dumps` writes them —
", " and ": " between items, `ensure_ascii=False`, Python's float repr — and a token estimate is
made of it. Encoding a 512 KB request again to learn that costs milliseconds; an upper bound of it
costs a count of the bytes at hand. Upper, never lower: the estimate feeds the free quotas, the
context a model must have and the output room of a paid quote, and a request must never look
smaller than it is (these bounds are within a few per cent of the figure: more commas and colons
in the text, more bound).
"""

from __future__ import annotations

# lanes: pure
import re
from typing import Any

import msgspec

from lanes._core.model.strictjson import Measured

_ENCODE = msgspec.json.Encoder().encode


#: A request shorter than this is sized by encoding it again (microseconds), so that a short
#: request's estimate is exactly what it always was; a longer one is counted.
COUNTED_FROM = 16 * 1024


def counted(raw: bytes, seen: Measured) -> int | None:
    """An upper bound of the bytes `json.dumps` writes for any part of the JSON value in `raw`
    (UTF-8, read whole by `strictjson.measured`, which saw `seen`); None for a request shorter
    than `COUNTED_FROM`. No string grows when written again (an escape is never shorter than
    what `json.dumps` writes for its character), a whole number or a literal keeps its length, a
    comma or a colon between items grows by one byte at most (its space), a line break and the
    blanks after it go (`layout`), and a number with a fraction or an exponent grows by what
    Python's repr adds to it; the object's own braces, quotes and names are more than the list
    `input_bytes` wraps its parts in ("[", ", null]")."""
    if len(raw) < COUNTED_FROM:
        return None
    return len(raw) - layout(raw) + seen.separators + seen.growth


#: a line break (CRLF too) and the blanks after it: outside every string (a JSON string holds no
#: raw control character, and no byte of a multi-byte character is one), never written by
#: json.dumps. Blanks before a line break stay counted: a pattern that starts with a run of blanks
#: is tried again from each blank of a run that ends in no line break — quadratic (the review: a
#: 160 KB run held the event loop 31 s)
_LAYOUT = re.compile(rb"\r?\n[ \t\r\n]*")


def layout(raw: bytes) -> int:
    """The bytes of a pretty-printed document's line breaks and the indentation after them (0
    for one on a line: a scan for a line break, ~10 µs at 512 KB; else linear, ~1 ms for an
    indented 512 KB body, 0.07 s for 4 MB of blanks and line breaks) — bytes
    no re-encoding writes, which counted as they are would make an indented agent request look
    12-23 % larger than it is (the hostile review, `indent=2` and `indent=4`)."""
    if b"\n" not in raw:
        return 0
    return len(raw) - len(_LAYOUT.sub(b"", raw))


def encoded(value: Any) -> bytes | None:
    """`value` as msgspec writes it — for a value of what strict JSON gives (and lanes'
    translations of it) holding no float, byte for byte what `json.dumps` writes compactly (with
    `ensure_ascii=False`); None when msgspec can not encode it."""
    try:
        return _ENCODE(value)
    except (msgspec.MsgspecError, TypeError, ValueError, RecursionError):
        return None


def written(*parts: bytes) -> int:
    """An upper bound of the bytes `json.dumps` writes for a list of the values `parts` encode
    (`encoded`), as `input_bytes` lists a chat's messages and tools: each part as it is, and a
    byte more for each comma and colon between items (all counted, those inside strings too:
    `json.dumps` puts a space after each), and the list's brackets and separators."""
    return sum(2 * len(part) - len(part.translate(None, b",:")) for part in parts) + 2 * len(parts)


def spliced(head: bytes, fields: list[tuple[str, bytes]]) -> bytes:
    """The JSON object `head` (encoded, with at least one member) with `fields` (a name, and
    its value encoded) added at its end."""
    pieces = [head[:-1]]
    for name, value in fields:
        pieces += [b',"', name.encode(), b'":', value]
    return b"".join([*pieces, b"}"])  # one copy of the parts, not one per `+`

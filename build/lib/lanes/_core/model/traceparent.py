"""The caller's W3C Trace Context (`traceparent`), read liberally and kept exactly. Pure.

A `traceparent` is `version-trace_id-parent_id-flags` in lower-case hex
(https://www.w3.org/TR/trace-context/#traceparent-header). One that is malformed is ignored, as
the recommendation asks (the job starts a trace of its own), never refused: tracing must not cost
a caller its answer. A later version may append fields; the first four are read.
"""

from __future__ import annotations

# lanes: pure
import re
from typing import Any

import attrs

#: The longest header read at all: version 00 is 55 characters; a later one may say more.
MAX_TRACEPARENT = 512
_FIELDS = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-[\x21-\x7e]*)?")


@attrs.frozen(kw_only=True)
class TraceParent:
    """The span a job's trace hangs from: its trace id and span id (as integers), and its flags
    (bit 0: the caller sampled it)."""

    trace_id: int
    span_id: int
    flags: int

    @property
    def sampled(self) -> bool:
        return bool(self.flags & 1)

    def header(self) -> str:
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-{self.flags:02x}"


def parse(value: Any) -> TraceParent | None:
    """`value` as a `TraceParent`, or None when it is absent or malformed (too long, not
    lower-case hex fields, version `ff`, an all-zero id, or version 00 with more after it)."""
    if not isinstance(value, str) or len(value) > MAX_TRACEPARENT:
        return None
    match = _FIELDS.fullmatch(value.strip(" \t"))
    if match is None:
        return None
    version, trace_id, span_id, flags, more = match.groups()
    if version == "ff" or (version == "00" and more):
        return None
    parent = TraceParent(trace_id=int(trace_id, 16), span_id=int(span_id, 16), flags=int(flags, 16))
    return parent if parent.trace_id and parent.span_id else None


def normalised(value: Any) -> str | None:
    """`value` as version 00 of the header when it is a valid `traceparent`, else None (a
    `Job`'s converter: what a job carries is always valid)."""
    parent = parse(value)
    return None if parent is None else parent.header()

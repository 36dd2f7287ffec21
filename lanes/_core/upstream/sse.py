"""A sans-io decoder for server-sent events, as OpenAI-compatible upstreams send them. Pure.

Feed it bytes as they arrive; it returns the `data` payloads of the events those bytes completed.
Comments (`: keep-alive`) complete nothing but still count as bytes, so a caller measuring idleness
by bytes sees them. Lines may end in LF, CRLF or CR; a UTF-8 character may be split across feeds.
"""

from __future__ import annotations

# lanes: pure
import codecs
import re

_EOL = re.compile(r"\r\n|\r|\n")


class SSEDecoder:
    """Incremental SSE parser keeping only what chat streams use: `data` fields, joined by LF."""

    def __init__(self, *, max_event_bytes: int = 4 * 1024 * 1024) -> None:
        self._text = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buffer = ""
        self._data: list[str] = []
        self._size = 0
        self._max = max_event_bytes
        self.oversized = 0  # events dropped for exceeding max_event_bytes

    def feed(self, chunk: bytes) -> list[str]:
        """Decode `chunk`; return the data of every event it completed, in order."""
        self._buffer += self._text.decode(chunk)
        return self._drain(final=False)

    def close(self) -> list[str]:
        """End of stream: flush a last event that was not followed by a blank line."""
        self._buffer += self._text.decode(b"", final=True)
        events = self._drain(final=True)
        if self._data:
            events.append("\n".join(self._data))
            self._data = []
        return events

    def _drain(self, *, final: bool) -> list[str]:
        events: list[str] = []
        while True:
            cut = _line_end(self._buffer, final)
            if cut is None:
                break
            end, skip = cut
            line, self._buffer = self._buffer[:end], self._buffer[end + skip :]
            if not line:
                if self._data:
                    if self._size <= self._max:
                        events.append("\n".join(self._data))
                    else:
                        self.oversized += 1
                self._data, self._size = [], 0
                continue
            if line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            if field == "data":
                value = value[1:] if value.startswith(" ") else value
                self._data.append(value)
                self._size += len(value)
        return events


def _line_end(buffer: str, final: bool) -> tuple[int, int] | None:
    """(index, separator length) of the first complete line ending, or None."""
    match = _EOL.search(buffer)
    if match is None:
        return (len(buffer), 0) if final and buffer else None
    if match.group() == "\r" and match.end() == len(buffer) and not final:
        return None  # a CR at the end may be the first half of a CRLF
    return match.start(), match.end() - match.start()

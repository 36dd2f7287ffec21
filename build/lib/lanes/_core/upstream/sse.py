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
    """Incremental SSE parser keeping only what chat streams use: `data` fields, joined by LF.

    No event and no line is ever held beyond `max_event_bytes`: an event that grows past it (or a
    line that does, before its end arrives) is dropped as it comes and counted in `oversized`."""

    def __init__(self, *, max_event_bytes: int = 4 * 1024 * 1024) -> None:
        self._text = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buffer = ""
        self._data: list[str] = []
        self._size = 0
        self._max = max_event_bytes
        self._overlong = False  # the buffer's start is the tail of a line already dropped
        self._counted = False  # the event being read is already counted as oversized
        self.oversized = 0  # events dropped for exceeding max_event_bytes (counted at once)

    def feed(self, chunk: bytes) -> list[str]:
        """Decode `chunk`; return the data of every event it completed, in order."""
        events = self._whole_lines(chunk)
        if events is not None:
            return events
        self._buffer += self._text.decode(chunk)
        events = self._drain(final=False)
        if len(self._buffer) > self._max:  # a line longer than any event may be: drop it now
            self._buffer, self._overlong = "", True
            self._data, self._size = [], self._max + 1
            self._over()
        return events

    def _whole_lines(self, chunk: bytes) -> list[str] | None:
        """The common case — whole lines, LF only, valid UTF-8, nothing left over from the last
        feed — read line by line without the incremental decoder and the line pattern; None for
        any other (`feed` then takes the general way, with the same result)."""
        if self._buffer or self._overlong or not chunk.endswith(b"\n"):
            return None
        try:
            text = chunk.decode("utf-8")
        except UnicodeDecodeError:
            return None
        if "\r" in text or self._text.getstate()[0]:
            return None
        events: list[str] = []
        for line in text.split("\n")[:-1]:
            self._line(line, events)
        return events

    def _over(self) -> None:
        """The event being read went over the cap: counted now, not when (if ever) it ends."""
        if not self._counted:
            self._counted = True
            self.oversized += 1

    def close(self) -> list[str]:
        """End of stream: flush a last event that was not followed by a blank line."""
        self._buffer += self._text.decode(b"", final=True)
        events = self._drain(final=True)
        self._dispatch(events)
        return events

    def _drain(self, *, final: bool) -> list[str]:
        events: list[str] = []
        buffer, pos = self._buffer, 0
        while pos < len(buffer):
            match = _EOL.search(buffer, pos)
            if match is None:
                if not final:
                    break
                line, pos = buffer[pos:], len(buffer)
            elif match.group() == "\r" and match.end() == len(buffer) and not final:
                break  # a CR at the end may be the first half of a CRLF
            else:
                line, pos = buffer[pos : match.start()], match.end()
            self._line(line, events)
        self._buffer = buffer[pos:]
        return events

    def _line(self, line: str, events: list[str]) -> None:
        if self._overlong:  # the end of a line that was dropped as it arrived
            self._overlong = False
            return
        if not line:
            self._dispatch(events)
            return
        if line.startswith(":"):
            return
        field, _, value = line.partition(":")
        if field == "data":
            value = value[1:] if value.startswith(" ") else value
            self._size += len(value) + (self._size > 0)  # the LF that joins it
            if self._size <= self._max:
                self._data.append(value)
            else:
                self._data = []
                self._over()

    def _dispatch(self, events: list[str]) -> None:
        if self._size <= self._max and self._data:
            events.append("\n".join(self._data))
        self._data, self._size, self._counted = [], 0, False

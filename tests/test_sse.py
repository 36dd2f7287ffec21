"""The sans-io SSE decoder: whole events however the bytes are split."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from lanes._core.upstream.sse import SSEDecoder


def decode_all(parts: list[bytes]) -> list[str]:
    decoder = SSEDecoder()
    out = []
    for part in parts:
        out += decoder.feed(part)
    return out + decoder.close()


def test_events_comments_and_line_endings():
    """LF, CRLF and CR all end lines; comments are ignored; multi-line data joins with LF."""
    raw = b": keep-alive\n\ndata: a\r\n\r\ndata: b\rdata: c\r\rdata:d\n\n"
    assert decode_all([raw]) == ["a", "b\nc", "d"]


def test_last_event_without_blank_line_is_flushed_on_close():
    """An event cut off before its blank line still arrives when the stream closes."""
    assert decode_all([b"data: [DONE]"]) == ["[DONE]"]


def test_utf8_split_across_feeds():
    """A multi-byte character split between two feeds decodes intact."""
    raw = "data: café ☕\n\n".encode()
    cut = raw.index("☕".encode()) + 1
    assert decode_all([raw[:cut], raw[cut:]]) == ["café ☕"]


def test_oversized_event_is_dropped_and_counted():
    """An event over the size limit is dropped, not buffered without bound."""
    decoder = SSEDecoder(max_event_bytes=10)
    assert decoder.feed(b"data: " + b"x" * 50 + b"\n\ndata: ok\n\n") == ["ok"]
    assert decoder.oversized == 1


events = st.lists(
    st.text(
        alphabet=st.characters(blacklist_characters="\r\n", blacklist_categories=["Cs"]),
        max_size=20,
    ),
    max_size=8,
)


@given(events, st.sampled_from(["\n", "\r\n", "\r"]), st.data())
def test_any_split_gives_the_same_events(payloads, eol, data):
    """Splitting the byte stream anywhere never changes the decoded events."""
    raw = "".join(f"data: {p}{eol}{eol}" for p in payloads).encode()
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=6)))
    parts = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    assert decode_all(parts) == payloads  # only the one space after "data:" is eaten


@given(st.binary(max_size=300))
def test_never_raises_on_garbage(raw):
    """Arbitrary bytes never raise."""
    decode_all([raw])

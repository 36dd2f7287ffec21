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


sse_like = st.lists(
    st.sampled_from(
        [b"data: ", b"data:", b": c", b"event: x", b"\n", b"\r", b"\r\n", b"\n\n", b"{}", b"ab"]
        + [b"\xc3", b"\xa9", b"\xff", "☕".encode(), b"x" * 20]
    ),
    max_size=40,
).map(b"".join)


class GeneralOnly(SSEDecoder):
    """The decoder without its quick way for whole LF lines."""

    def _whole_lines(self, chunk: bytes) -> None:
        return None


@given(sse_like, st.data())
def test_the_quick_way_for_whole_lines_changes_nothing(raw, data):
    """Any bytes (CRs, broken UTF-8, events over the size limit among them), fed whole or cut
    anywhere: the same events, and the same count of oversized ones, as the general way gives."""
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=6)))
    parts = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    results = []
    for decoder in (SSEDecoder(max_event_bytes=16), GeneralOnly(max_event_bytes=16)):
        events = [e for part in parts for e in decoder.feed(part)] + decoder.close()
        results.append((events, decoder.oversized))
    assert results[0] == results[1]


def test_a_broken_character_left_over_is_not_forgotten():
    """A feed that ends in the first byte of a character, then whole lines: the byte still becomes
    a replacement character at the start of the next line, as the general way makes it."""
    parts = [b"data: a\n\n", b"\xc3", b"data: b\n\n"]
    for decoder in (SSEDecoder(), GeneralOnly()):
        assert [e for part in parts for e in decoder.feed(part)] == ["a"]
    assert decode_all([b"\xc3", b"data: b\n\n"]) == []  # "\ufffddata: b" is no data line
    assert decode_all([b"data: \xc3", b"x\n\n"]) == ["\ufffdx"]

"""Strict JSON: the quick path (the text shows a document safe) says what the long walk says."""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from helpers import examples
from lanes._core.model import strictjson

leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
values = st.recursive(
    leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=30,
)
# what could make a document refused, spliced into an otherwise good one
hostile = st.sampled_from(
    [
        "1e999",
        "-1e400",
        "NaN",
        "Infinity",
        '"\\ud800"',
        '"\\uDFFF x"',
        '"\\ud83d\\ude00"',
        '"\\\\ud800"',
        "[" * 70 + "]" * 70,
        "{" * 3,
        "1.5",
        '"é"',
    ]
)


def outcome(parse, raw):
    try:
        return ("value", parse(raw))
    except strictjson.JSONRefused as exc:
        return ("refused", str(exc), exc.where)


def judged_alike(raw: str | bytes) -> None:
    """The quick path gives what parsing and walking everything gives: the same value, or the
    same refusal naming the same place."""
    quick = outcome(strictjson.loads, raw)
    walked = outcome(lambda r: strictjson._walked(r, strictjson.MAX_DEPTH), raw)
    assert quick[0] == walked[0]
    if quick[0] == "value":
        assert json.dumps(quick[1]) == json.dumps(walked[1])
    else:
        assert quick == walked


@settings(max_examples=examples(400))
@given(values, hostile, st.integers(0, 200), st.sampled_from(["str", "utf-8", "utf-16"]))
def test_the_quick_path_agrees_with_the_walk(value, splice, at, form):
    """Any document, good or spliced with something refused, in text, UTF-8 or UTF-16: the same
    value, or the same refusal naming the same place, as parsing and walking everything."""
    text = json.dumps(value)
    if at % 2:  # half the documents get the splice, as an array item or a value
        text = f"[{text}, {splice}]" if at % 4 == 1 else f'{{"k": {splice}, "v": {text}}}'
    raw: str | bytes = text if form == "str" else text.encode(form, "surrogatepass")
    judged_alike(raw)


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        (b'{"a": [1, 2e999]}', "a[1]"),
        (b'{"a": {"b": "\\ud800"}}', "a.b"),
        ('{"a": "\ud800"}', "a"),
        (b'{"a": "\xed\xa0\x80"}', "a"),
    ],
)
def test_refusals_still_name_where(raw, where):
    """An overflowing number or a lone surrogate (escaped, raw, or in UTF-8 bytes) is refused with
    its place named, as before the quick path."""
    with pytest.raises(strictjson.JSONRefused) as caught:
        strictjson.loads(raw)
    assert caught.value.where == where


@pytest.mark.parametrize(
    "raw", [b'{"a": "\xff"}', "\ufeff{}", b"\xef\xbb\xbf{}", b'{"a": 1,}', "[1] x", b""]
)
def test_odd_documents_get_what_the_long_way_gives(raw):
    """Bytes that are not UTF-8, a byte-order mark (refused in text, skipped in bytes, as json.loads
    does), a trailing comma or trailing text: the same value or refusal, with the same message, as
    parsing with json.loads and walking."""
    assert outcome(strictjson.loads, raw) == outcome(
        lambda r: strictjson._walked(r, strictjson.MAX_DEPTH), raw
    )


# escapes and brackets inside strings: whole strings, so that many levels hold the same trick
tricky = st.sampled_from(["\\", "\\\\", '"', '\\"', "x", "", "[", '{"a": ["', "]", "\\["])


@settings(max_examples=examples(300))
@given(
    st.lists(st.tuples(tricky, tricky), min_size=58, max_size=70),
    st.booleans(),
    st.sampled_from(["str", "utf-8"]),
)
@example([("\\", "\\")] * 70, False, "utf-8")  # a string's last quote escaped would hide levels
def test_a_long_document_is_judged_by_the_brackets_outside_its_strings(texts, objects, form):
    """A document past the short count (4 KB), nested near the bound with strings full of
    backslashes, quotes and brackets around each level: the same value, or the same refusal, as
    parsing and walking everything — no string hides a level, nor makes one."""
    value: object = "y" * 5000
    for before, after in texts:  # a level: [before, inner, after] or {before: inner, "": after}
        value = {before: value, "": after} if objects else [before, value, after]
    text = json.dumps(value)
    raw: str | bytes = text if form == "str" else text.encode()
    judged_alike(raw)


@settings(max_examples=examples(2000))
@given(st.lists(st.sampled_from([b"\\", b'"', b"n", b"[", b"\\\\"]), max_size=400))
@example([b"\\"] * 300 + [b'"'])  # past the regex's budget: the replaces take the rest
def test_escapes_are_taken_as_the_replaces_take_them(pieces):
    """The structure pass takes escaped backslashes and quotes away as two replaces do (each run
    of backslashes loses its pairs left to right, a lone one before a quote goes with it), the
    regex's budget (one per 64 bytes) reached or not."""
    text = b"".join(pieces)
    assert strictjson._unescaped(text) == text.replace(b"\\\\", b"").replace(b'\\"', b"")


def test_the_escape_regex_takes_at_most_one_escape_per_64_bytes(monkeypatch):
    """The regex takes a body's escapes up to one per 64 bytes and leaves the rest to the
    replaces: each substitution costs the regex more than a replace's copy (unbounded, 4 MB of
    escaped backslashes held the loop 0.3 s, against 0.03 s)."""
    asked: list[int] = []
    pattern = strictjson._ESCAPE

    class Counted:
        def subn(self, repl: bytes, text: bytes, count: int = 0) -> tuple[bytes, int]:
            asked.append(count)
            return pattern.subn(repl, text, count=count)

    monkeypatch.setattr(strictjson, "_ESCAPE", Counted())
    text = b'["' + b"\\\\" * 100_000 + b'"]'
    assert strictjson._unescaped(text) == b'[""]'
    assert asked == [len(text) // 64]

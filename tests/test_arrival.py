"""A request a door reads is sized and digested from its bytes as they arrived: its size never
below what encoding it again gives (a token estimate is made of it, and it feeds the free quotas
and the paid quote), its digest that of the bytes; a translated request's size never below its
translation's."""

from __future__ import annotations

import hashlib
import json
import random
import time
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import examples
from lanes import Job
from lanes._core.model import arrival, strictjson
from lanes._http.validation import parse_job

TEXT = st.text(max_size=12)  # any characters: quotes, backslashes, controls, non-ASCII
LEAVES = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT
)
VALUES = st.recursive(
    LEAVES,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=30,
)
NO_FLOATS = st.recursive(
    st.none() | st.booleans() | st.integers() | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=30,
)
MESSAGES = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant"]), "content": TEXT},
        optional={"name": TEXT, "extra": VALUES},
    ),
    min_size=1,
    max_size=4,
)
TOOLS = st.none() | st.lists(
    st.fixed_dictionaries(
        {
            "type": st.just("function"),
            "function": st.fixed_dictionaries({"name": TEXT, "parameters": VALUES}),
        }
    ),
    max_size=3,
)


def written(value: Any, rnd: random.Random) -> str:
    """`value` as JSON the way some client might write it: spaced or not, escaped or not, its
    numbers in another form than Python's repr (1e5 for 100000.0, an E, a + in an exponent)."""
    space = rnd.choice(["", " ", "\n  "])
    if isinstance(value, dict):
        items = [f"{written(k, rnd)}:{space}{written(v, rnd)}" for k, v in value.items()]
        return "{" + f",{space}".join(items) + "}"
    if isinstance(value, list):
        return "[" + f",{space}".join(written(v, rnd) for v in value) + "]"
    if isinstance(value, float):
        return _number(value, rnd)
    return json.dumps(value, ensure_ascii=rnd.random() < 0.5)


def _number(value: float, rnd: random.Random) -> str:
    if value.is_integer() and abs(value) < 1e16 and rnd.random() < 0.5:
        digits = str(int(value))
        kept = digits.rstrip("0")
        if kept and kept != "-":
            return f"{kept}{rnd.choice('eE')}{rnd.choice(['', '+'])}{len(digits) - len(kept)}"
    long = f"{value:.17g}"
    return rnd.choice(
        [repr(value), long if "." in long or "e" in long else long + ".0", f"{value:.17E}"]
    )


@settings(max_examples=examples(300))
@given(MESSAGES, TOOLS, VALUES, st.randoms(use_true_random=False), st.booleans())
def test_a_chat_request_is_never_counted_smaller_than_it_is(messages, tools, other, rnd, long):
    """However the client wrote it, a chat request's counted size (a long one's counted from its
    bytes, a short one's encoded again) is at least its messages and tools encoded again, and its
    digest is its bytes'."""
    body: dict[str, Any] = {"model": "m", "messages": messages, "other": other}
    if tools is not None:
        body["tools"] = tools
    if long:  # long enough to be counted: in a message, or beside the messages
        where = messages[-1] if rnd.random() < 0.5 else body
        where["padding"] = "x, y: z\n" * (arrival.COUNTED_FROM // 8)
    raw = written(body, rnd).encode()
    job, _ = parse_job(raw, {}, "client")
    again = json.dumps([list(job.messages), job.params.get("tools")], ensure_ascii=False)
    assert job.input_bytes() >= len(again.encode())
    assert job.fingerprint() == (hashlib.sha256(raw).hexdigest(), len(raw))


@settings(max_examples=examples(300))
@given(NO_FLOATS, NO_FLOATS)
def test_a_translation_without_floats_is_never_counted_smaller_than_it_is(messages, tools):
    """Messages and tools with no float (what a translated request holds when its body held
    none), encoded quickly: their bound is at least what `input_bytes` encodes."""
    first, second = arrival.encoded(messages), arrival.encoded(tools)
    assert first is not None and second is not None
    again = json.dumps([messages, tools], ensure_ascii=False)
    assert arrival.written(first, second) >= len(again.encode())


@settings(max_examples=examples(200))
@given(MESSAGES, TOOLS, st.dictionaries(TEXT, NO_FLOATS, max_size=3), st.booleans())
def test_a_translated_request_is_sent_as_its_body_says(messages, tools, params, stream):
    """A plain translated request's upstream body, its messages and tools spliced in as they
    were encoded when it arrived: the same JSON as its body, as long as `json.dumps` writes it
    (what the paid worst case counts)."""
    messages = [{**m, "content": "x, y: z\n" * (arrival.COUNTED_FROM // 8)} for m in messages]
    messages = json.loads(json.dumps(messages), parse_float=lambda _: 0)  # no float
    params = {k: v for k, v in params.items() if k not in ("model", "messages", "stream")}
    if tools is not None:
        params["tools"] = json.loads(json.dumps(tools), parse_float=lambda _: 0)
    job = Job(messages=messages, params=params)
    job.arrived(json.dumps({"messages": messages, **params}).encode(), plain=True)
    sent = job.body_bytes("m", stream=stream)
    body = job.body("m", stream=stream)
    assert sent is not None and json.loads(sent) == body
    compact = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    assert len(sent) == len(compact.encode())


@settings(max_examples=examples(200))
@given(VALUES, st.randoms(use_true_random=False))
def test_measured_reads_what_loads_reads(value, rnd):
    """`measured` gives the value `loads` gives, and counts what Python's repr adds to the
    numbers as written."""
    raw = written({"v": value}, rnd)
    got, seen = strictjson.measured(raw.encode())
    assert json.dumps(got) == json.dumps(strictjson.loads(raw)) == json.dumps({"v": value})
    assert seen is not None and seen.growth >= 0


def test_a_pretty_printed_request_is_counted_as_closely_as_a_compact_one():
    """Indentation and line breaks are no part of what is re-encoded: an agent request written
    with `indent=2`, `indent=4` or tabs is counted within a few per cent of what `json.dumps`
    writes for it, as a compact one is (the hostile review: 12-23 % over, which could send a
    request near a free model's context to a paid one)."""
    tool = {"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}
    said = "a line of a file, with a colon: and a comma, as tool results hold\n" * 8
    messages = [{"role": "user", "content": said}, {"role": "tool", "content": said}] * 40
    body = {"model": "m", "messages": messages, "tools": [tool] * 40}
    again = len(json.dumps([messages, body["tools"]], ensure_ascii=False).encode())
    for indent in (None, 2, 4, "\t"):
        raw = json.dumps(body, indent=indent).encode()
        job, _ = parse_job(raw, {}, "client")
        assert again <= job.input_bytes() <= again * 1.03, (indent, job.input_bytes(), again)


def test_a_long_run_of_blanks_is_counted_at_once():
    """A request padded with 4 MB of blanks and a line break after them (the largest body a door
    takes) is counted in a linear scan: the review's pattern, tried again from each blank of the
    run, took 31 s for 160 KB (hours for 4 MB) on the event loop. A bound far above the ~0.1 s
    it takes, in process time, so a loaded machine never trips it."""
    raw = b'{"model":"m","messages":[{"role":"user","content":"hi"}]' + b" " * (4 << 20) + b"}\n"
    start = time.process_time()
    job, _ = parse_job(raw, {}, "client")
    assert time.process_time() - start < 10.0
    assert job.input_bytes() >= len(json.dumps([[{"role": "user", "content": "hi"}]]))

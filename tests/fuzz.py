"""Hypothesis strategies for what a hostile world sends the sidecar — client requests (bodies and
headers) and upstream answers (status, headers, bodies, SSE streams, usage values) — and the
checks every fuzz test makes of what came back."""

from __future__ import annotations

import gzip
import json
from typing import Any

import attrs
from hypothesis import strategies as st

from lanes._core.freetier.prices import usage_cost
from lanes.testing import ANSWER, Behaviour, raw
from lanes.testing.fakes import stream_events

PRICES = (1.0, 2.0)  # USD per million tokens in and out, as `paid_lane` configures them
MAX_TOKENS = 50  # what every fuzzed job asks for at most
SMALL_CAP = 64 * 1024  # the hostile lane's max_response_bytes in the fuzz configs
#: The fuzz configs' policy: a failed hostile attempt leaves room for the healthy lane behind it.
POLICY = {
    "free_tier_fallback": "allow",
    "paid_attempts": 3,
    "max_attempts": 4,
    "transient_retries": 0,
    "max_wait_s": 0,
    "paid_ceiling_usd_per_day": 1000.0,
}
EVENT_CAP = 16 * 1024  # and its max_event_bytes


@attrs.frozen
class Answer:
    """One scripted upstream answer and what the upstream bills for it (None: nothing sane)."""

    behaviour: Behaviour
    billed: tuple[int, int] | None  # (prompt, completion) tokens an honest upstream would bill
    served: bool  # a well-formed answer the sidecar may relay as it is (to a request of its kind)
    stream: bool = False  # an SSE answer (for a streamed request), else a JSON one

    def serves(self, stream: bool) -> bool:
        """A well-formed answer to a request streamed (or not) as this one."""
        return self.served and self.stream == stream


# -- usage values -----------------------------------------------------------------------------

sane_usage = st.tuples(st.integers(0, 20), st.integers(0, MAX_TOKENS)).map(
    lambda t: ({"prompt_tokens": t[0], "completion_tokens": t[1], "total_tokens": sum(t)}, t)
)
absurd_number: st.SearchStrategy[Any] = st.sampled_from(
    [2**64, 2**70, 10**30, 1e300, -1, -(2**63), 0.5, "12", None, [], {}, True, 10**400 // 10**200]
)
absurd_usage = st.one_of(
    st.fixed_dictionaries({"total_tokens": absurd_number}),
    st.fixed_dictionaries({"prompt_tokens": absurd_number, "completion_tokens": absurd_number}),
    st.sampled_from(["lots", 7, [1, 2], None]),
).map(lambda usage: (usage, None))
usages = st.one_of(sane_usage, absurd_usage)

# -- headers --------------------------------------------------------------------------------

header_values = st.one_of(
    st.sampled_from(
        ["1e308", "1e20", "-1", "NaN", "inf", "0", "9" * 40, "1.5", "", "Wed, 21 Oct 2099 07:28:00"]
    ),
    st.integers(-(10**12), 10**15).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=20),
)
header_names = st.sampled_from(
    [
        "retry-after",
        "retry-after-ms",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-reset-requests",
        "x-ratelimit-limit-tokens",
        "x-ratelimit-reset-tokens",
        "ratelimit",
        "x-ratelimit-reset",
    ]
)
upstream_headers = st.dictionaries(header_names, header_values, max_size=3)

# -- bodies ---------------------------------------------------------------------------------


def completion(content: Any = ANSWER, usage: Any = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": "chatcmpl-fuzz",
        "object": "chat.completion",
        "model": "sick-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        **extra,
    }
    if usage is not None:
        body["usage"] = usage
    return body


def _encode(value: Any) -> bytes:
    return json.dumps(value).encode()


garbage_bodies = st.sampled_from(
    [
        b"",
        b"<html>502 Bad Gateway</html>",
        b'{"choices": [',
        b"null",
        b"[]",
        b'{"choices": "none"}',
        b'{"choices": [7]}',
        b'{"choices": [{"message": {"content": NaN}}]}',
        b'{"choices": [{"message": {"content": "x"}}], "n": Infinity}',
        b'{"choices": [{"message": {"content": "\\ud800"}}]}',
        b"[" * 3000 + b"]" * 3000,
        b'{"error": "down"}',
        b'{"error": {"message": "context length exceeded", "code": "context_length_exceeded"}}',
        b'{"error": {"message": "insufficient credits", "code": 402}}',
        b"\xff\xfe\x00garbage",
        b"x" * (SMALL_CAP + 1),
    ]
)


@st.composite
def json_answers(draw: st.DrawFn) -> Answer:
    """A non-streamed answer: a status, hostile headers and a body of any kind."""
    status = draw(
        st.sampled_from([200] * 6 + [400, 401, 402, 403, 404, 408, 413, 418, 422, 429, 500, 503])
    )
    headers = draw(upstream_headers)
    kind = draw(st.sampled_from(["completion", "completion", "garbage", "gzip", "bomb", "error"]))
    usage, billed = draw(usages)
    if kind == "completion":
        content = draw(st.sampled_from([ANSWER, "", None, 7, ["x"], {"a": 1}]))
        body = _encode(completion(content, usage))
        ok = status == 200 and (content is None or isinstance(content, str))
        return Answer(raw(status, body, headers=headers), billed if ok else None, ok)
    if kind == "gzip":
        body = gzip.compress(_encode(completion(ANSWER, usage)))
        headers = {**headers, "content-encoding": "gzip"}
        ok = status == 200
        return Answer(raw(status, body, headers=headers), billed if ok else None, ok)
    if kind == "bomb":
        body = gzip.compress(b"\0" * (4 * SMALL_CAP))
        return Answer(
            raw(status, body, headers={**headers, "content-encoding": "gzip"}), None, False
        )
    if kind == "error":
        message = draw(st.sampled_from(["rate limit", "model not found", "overloaded", "x" * 5000]))
        body = _encode(
            {"error": {"message": message, "code": draw(st.sampled_from([None, 1, "e"]))}}
        )
        return Answer(raw(status, body, headers=headers), None, False)
    return Answer(raw(status, draw(garbage_bodies), headers=headers), None, False)


def _chunk(delta: Any, finish: Any = None, usage: Any = None) -> bytes:
    chunk: dict[str, Any] = {
        "id": "chatcmpl-fuzz",
        "object": "chat.completion.chunk",
        "model": "sick-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage is not None:
        chunk = {**chunk, "choices": [], "usage": usage}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


sse_faults = st.sampled_from(
    [
        b"data: {not json\n\n",
        b": keep-alive\n\n",
        b'data: {"error": {"message": "overloaded"}}\n\n',
        b'data: {"choices": "x"}\n\n',
        b'data: {"choices": [7]}\n\n',
        b'data: {"choices": [{"delta": "x"}]}\n\n',
        b'data: {"choices": [{"delta": {"content": 5}}]}\n\n',
        b'data: {"choices": [{"delta": {"content": NaN}}]}\n\n',
        b"data: " + b"y" * (EVENT_CAP + 1) + b"\n\n",
        b"z" * (EVENT_CAP + 1),
        b"data: [DONE]\n\n",
        b"\r\n",
        b"data: \xff\xfe\n\n",
    ]
)


@st.composite
def stream_answers(draw: st.DrawFn) -> Answer:
    """A streamed answer: healthy events with faults spliced in, cut, unterminated, or not SSE."""
    usage, billed = draw(usages)
    events = stream_events(ANSWER, "sick-model")
    if draw(st.booleans()):
        events.append(_chunk({}, usage=usage))
    else:
        billed = None  # no usage sent: nothing billed that the sidecar could know of
    faults = draw(st.lists(st.tuples(st.integers(0, len(events)), sse_faults), max_size=3))
    for at, fault in sorted(faults, reverse=True):
        events.insert(at, fault)
    ending = draw(st.sampled_from(["done", "done", "none", "cut"]))
    if ending == "done":
        events.append(b"data: [DONE]\n\n")
    elif ending == "cut":
        events = events[: draw(st.integers(0, len(events)))]
    content_type = draw(
        st.sampled_from(["text/event-stream"] * 5 + ["application/json", "text/html"])
    )
    status = draw(st.sampled_from([200] * 8 + [429, 500, 400]))
    headers = {"content-type": content_type, **draw(upstream_headers)}
    chunks = tuple(events)
    clean = not faults and ending == "done" and content_type == "text/event-stream"
    ok = clean and status == 200
    return Answer(
        raw(status, headers=headers, chunks=lambda: chunks), billed if ok else None, ok, stream=True
    )


def billed_usd(answers: list[tuple[Answer, bool]]) -> float:
    """What an honest upstream billed for the answers it sent (`(answer, sent)` pairs)."""
    total = 0.0
    for answer, sent in answers:
        if sent and answer.billed is not None:
            prompt, completion_tokens = answer.billed
            usage = {"prompt_tokens": prompt, "completion_tokens": completion_tokens}
            total += usage_cost(usage, *PRICES) or 0.0
    return total


# -- client requests ------------------------------------------------------------------------

roles = st.one_of(
    st.sampled_from(["user", "system", "assistant", "tool"]),
    st.just(["user"]),
    st.just(7),
    st.none(),
)
contents = st.one_of(
    st.text(max_size=30),
    st.none(),
    st.integers(),
    st.lists(
        st.fixed_dictionaries({"type": st.sampled_from(["text", 5]), "text": st.text(max_size=5)}),
        max_size=2,
    ),
    st.just(float("nan")),
    st.just(float("inf")),
)
messages = st.lists(
    st.fixed_dictionaries({"role": roles, "content": contents}), min_size=0, max_size=3
)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=10), st.just(10**30)
)
request_bodies = st.fixed_dictionaries(
    {"messages": st.one_of(messages, scalars)},
    optional={
        "model": st.one_of(st.sampled_from(["auto", "good/good-model", "nope", ""]), scalars),
        "stream": st.one_of(st.booleans(), scalars),
        "max_tokens": st.one_of(st.integers(-5, 10**9), scalars),
        "tools": st.one_of(st.just([{"type": "function", "function": {"name": "f"}}]), scalars),
        "response_format": st.one_of(st.just({"type": "json_object"}), scalars),
        "temperature": scalars,
    },
)


@st.composite
def raw_bodies(draw: st.DrawFn) -> bytes:
    """A request body: JSON from the strategy above (NaN allowed), or bytes bent out of shape."""
    body = json.dumps(draw(request_bodies), allow_nan=True).encode()
    how = draw(st.sampled_from(["as is"] * 6 + ["truncate", "nest", "surrogate", "bytes", "empty"]))
    if how == "truncate":
        return body[: draw(st.integers(0, len(body)))]
    if how == "nest":
        depth = draw(st.sampled_from([70, 1000, 20000]))
        return body[:-1] + b', "x": ' + b"[" * depth + b"]" * depth + b"}"
    if how == "surrogate":
        return body.replace(b'"user"', b'"\\ud800"', 1).replace(b'"messages"', b'"\\udfff"', 1)
    if how == "bytes":
        return draw(st.binary(max_size=40))
    if how == "empty":
        return b""
    return body


header_bytes = st.one_of(
    st.sampled_from([b"250", b"0", b"\xb2", b"\xb9\xb2", b"1e3", b"-1", b"99999999999", b" 7 "]),
    st.binary(min_size=0, max_size=12).filter(lambda b: b"\r" not in b and b"\n" not in b),
)
request_headers = st.dictionaries(
    st.sampled_from(
        [
            b"x-lanes-deadline-ms",
            b"x-lanes-privacy",
            b"x-lanes-cohort",
            b"x-lanes-class",
            b"authorization",
        ]
    ),
    header_bytes,
    max_size=3,
)


def http_request(path: str, headers: dict[bytes, bytes], body: bytes) -> bytes:
    """The bytes of one HTTP/1.1 request (closing the connection after it)."""
    head = [b"POST " + path.encode() + b" HTTP/1.1", b"host: 127.0.0.1", b"connection: close"]
    head += [b"content-type: application/json", b"content-length: %d" % len(body)]
    head += [name + b": " + value.strip() for name, value in headers.items()]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def check_error_shape(body: bytes) -> dict[str, Any]:
    """An OpenAI-shaped error body, or AssertionError."""
    error = json.loads(body)["error"]
    assert set(error) >= {"message", "type", "code", "param"}, error
    assert isinstance(error["message"], str) and error["message"]
    return error

"""The doors' hot paths, made cheap for a long history, say and send what they always did:
the same refusal naming the same field (pinned from the code before it was made cheap),
a tool call's arguments as `json.dumps` writes them, and events as compact JSON."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from lanes._core.dialects import messages_api, responses_api, responses_stream, responses_tools
from lanes._core.dialects.common import BadField, compact, spaced, sse_event, written_once
from lanes._http.errors import BadRequest
from lanes._http.validation import chat_fields

TEXT = st.text(max_size=12)  # any characters: quotes, backslashes, controls, non-ASCII
NO_FLOATS = st.recursive(
    st.none() | st.booleans() | st.integers() | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=30,
)
VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=30,
)

#: (a Messages request's `messages`, the field its refusal names, the refusal)
MESSAGES = [
    (["x"], "messages.0", "messages.0: must be an object"),
    ([{"content": "x"}], "messages.0.role", "messages.0.role: must be user, assistant or system"),
    ([{"role": "user"}], "messages.0.content", "messages.0.content: must be a string or an array"),
    (
        [{"role": "user", "content": 5}],
        "messages.0.content",
        "messages.0.content: must be a string or an array",
    ),
    (
        [{"role": ["user"], "content": "x"}],
        "messages.0.role",
        "messages.0.role: must be user, assistant or system",
    ),
    (
        [{"role": "system", "content": 5}],
        "messages.0.content",
        "messages.0.content: must be a string or an array of text blocks",
    ),
    (
        [{"role": "assistant", "content": [5]}],
        "messages.0.content.0",
        "messages.0.content.0: must be an object",
    ),
    (
        [{"role": "assistant", "content": [{}]}],
        "messages.0.content.0.type",
        "messages.0.content.0.type: Field required",
    ),
    (
        [{"role": "assistant", "content": [{"type": 5}]}],
        "messages.0.content.0.type",
        "messages.0.content.0.type: Field required",
    ),
    (
        [{"role": "assistant", "content": [{"type": "text"}]}],
        "messages.0.content.0.text",
        "messages.0.content.0.text: must be a string",
    ),
    (
        [{"role": "assistant", "content": [{"type": "text", "text": 5}]}],
        "messages.0.content.0.text",
        "messages.0.content.0.text: must be a string",
    ),
    (
        [
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": None, "name": "f", "input": {}}],
            }
        ],
        "messages.0.content.0.id",
        "messages.0.content.0.id: Field required",
    ),
    (
        [
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "", "name": "f", "input": {}}],
            }
        ],
        "messages.0.content.0.id",
        "messages.0.content.0.id: Field required",
    ),
    (
        [
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": None, "input": {}}],
            }
        ],
        "messages.0.content.0.name",
        "messages.0.content.0.name: Field required",
    ),
    (
        [
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "", "input": {}}],
            }
        ],
        "messages.0.content.0.name",
        "messages.0.content.0.name: Field required",
    ),
    (
        [
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": [1]}],
            }
        ],
        "messages.0.content.0.input",
        "messages.0.content.0.input: must be an object",
    ),
    (
        [
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": None}],
            }
        ],
        "messages.0.content.0.input",
        "messages.0.content.0.input: must be an object",
    ),
    (
        [{"role": "assistant", "content": [{"type": "image"}]}],
        "messages.0.content.0.type",
        "messages.0.content.0.type: 'image' is not supported in an assistant turn",
    ),
    (
        [
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}},
                    {"type": "text", "text": "x"},
                    7,
                ],
            }
        ],
        "messages.0.content.2",
        "messages.0.content.2: must be an object",
    ),
    (
        [{"role": "user", "content": [5]}],
        "messages.0.content.0",
        "messages.0.content.0: must be an object",
    ),
    (
        [{"role": "user", "content": [{"type": "tool_result"}]}],
        "messages.0.content.0.tool_use_id",
        "messages.0.content.0.tool_use_id: Field required",
    ),
    (
        [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": ""}]}],
        "messages.0.content.0.tool_use_id",
        "messages.0.content.0.tool_use_id: Field required",
    ),
    (
        [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": 5}]}],
        "messages.0.content.0.content",
        "messages.0.content.0.content: must be a string or text blocks",
    ),
    (
        [
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t", "content": [5]}],
            }
        ],
        "messages.0.content.0.content.0",
        "messages.0.content.0.content.0: must be an object",
    ),
    (
        [
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "document"}]}
                ],
            }
        ],
        "messages.0.content.0.content.0.type",
        "messages.0.content.0.content.0.type: only text and images are supported in a tool result",
    ),
    (
        [
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t",
                        "content": [{"type": "text", "text": "a"}, {"type": "image"}],
                    }
                ],
            }
        ],
        "messages.0.content.0.content.1.source",
        "messages.0.content.0.content.1.source: Field required",
    ),
    (
        [{"role": "user", "content": [{"type": "text"}]}],
        "messages.0.content.0.text",
        "messages.0.content.0.text: must be a string",
    ),
    (
        [{"role": "user", "content": [{"type": "image"}]}],
        "messages.0.content.0.source",
        "messages.0.content.0.source: Field required",
    ),
    (
        [{"role": "user", "content": [{"type": "tool_use"}]}],
        "messages.0.content.0.type",
        "messages.0.content.0.type: 'tool_use' is not supported",
    ),
    (
        [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": [{"type": "text", "text": "y"}, {}]},
        ],
        "messages.1.content.1.type",
        "messages.1.content.1.type: Field required",
    ),
]
BRIDGED = "(message, function_call, function_call_output)"
#: (a Responses request's `input`, the field its refusal names, the refusal)
RESPONSES = [
    ([5], "input[0]", "input[0] must be an object"),
    (["x"], "input[0]", "input[0] must be an object"),
    (
        [{"type": {}}],
        "input[0].type",
        "input[0].type '{}' is not supported: lanes bridges to chat completions " + BRIDGED,
    ),
    (
        [{"type": 5}],
        "input[0].type",
        "input[0].type '5' is not supported: lanes bridges to chat completions " + BRIDGED,
    ),
    (
        [{}],
        "input[0].type",
        "input[0].type 'None' is not supported: lanes bridges to chat completions " + BRIDGED,
    ),
    (
        [{"type": "function_call", "call_id": "c", "arguments": "{}"}],
        "input[0].name",
        "input[0].name must be a string",
    ),
    (
        [{"type": "function_call", "call_id": "c", "name": "", "arguments": "{}"}],
        "input[0].name",
        "input[0].name must be a string",
    ),
    (
        [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}],
        "input[0].arguments",
        "input[0].arguments must be a string",
    ),
    (
        [{"type": "function_call", "call_id": 5, "name": "f", "arguments": {}}],
        "input[0].call_id",
        "input[0].call_id must be a string",
    ),
    (
        [{"type": "function_call_output", "output": "x"}],
        "input[0].call_id",
        "input[0].call_id must be a string",
    ),
    (
        [{"type": "function_call_output", "call_id": "", "output": "x"}],
        "input[0].call_id",
        "input[0].call_id must be a string",
    ),
    (
        [{"type": "function_call_output", "call_id": "c", "output": 5}],
        "input[0].output",
        "input[0].output must be a string or an array of parts",
    ),
    (
        [
            {
                "type": "function_call_output",
                "call_id": "c",
                "output": [{"type": "input_image", "image_url": "u"}],
            }
        ],
        "input[0].output[0].type",
        "input[0].output[0].type 'input_image' is not supported here",
    ),
    (
        [{"role": "bogus", "content": "x"}],
        "input[0].role",
        "input[0].role must be user, assistant, system or developer",
    ),
    (
        [{"type": "message", "content": "x"}],
        "input[0].role",
        "input[0].role must be user, assistant, system or developer",
    ),
    (
        [{"role": "user", "content": "x"}, {"type": "web_search_call"}, 5],
        "input[2]",
        "input[2] must be an object",
    ),
]


@pytest.mark.parametrize(("messages", "param", "said"), MESSAGES)
def test_a_messages_history_is_refused_as_it_was(messages: Any, param: str, said: str) -> None:
    """A malformed message or block is refused with the words and field it always had."""
    with pytest.raises(BadField) as refused:
        messages_api.to_chat({"model": "m", "max_tokens": 5, "messages": messages})
    assert (refused.value.param, str(refused.value)) == (param, said)


@pytest.mark.parametrize(("items", "param", "said"), RESPONSES)
def test_a_responses_input_is_refused_as_it_was(items: Any, param: str, said: str) -> None:
    """A malformed input item is refused with the words and field it always had."""
    with pytest.raises(BadField) as refused:
        responses_api.to_chat({"input": items})
    assert (refused.value.param, str(refused.value)) == (param, said)


@given(st.dictionaries(TEXT, VALUES, max_size=4))
def test_a_tool_use_input_goes_upstream_as_json_dumps_writes_it(arguments: dict[str, Any]) -> None:
    """A `tool_use` block's input becomes the arguments `json.dumps(input, ensure_ascii=False)`
    writes, floats and spaces included: the upstream's bytes do not change."""
    use = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": arguments}
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "assistant", "content": [use]}]}
    call = messages_api.to_chat(body).messages[0]["tool_calls"][0]
    assert call["function"]["arguments"] == json.dumps(arguments, ensure_ascii=False)


#: what json.dumps takes that strict JSON never gives: NaN and infinities, keys that are not text
ODD = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | TEXT,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(TEXT | st.integers() | st.floats() | st.booleans() | st.none(), inner)
    ),
    max_leaves=30,
)


def _outcome(encode: Any, value: Any) -> tuple[str, str]:
    try:
        return "ok", encode(value)
    except (TypeError, ValueError, RecursionError) as exc:
        return type(exc).__name__, str(exc)


@given(ODD)
def test_spaced_writes_what_json_dumps_writes(value: Any) -> None:
    """`spaced` (json's C encoder, made once) writes `json.dumps(value, ensure_ascii=False)`:
    the same text, NaN, keys of every type and tuples included."""
    assert spaced(value) == json.dumps(value, ensure_ascii=False)


def test_spaced_refuses_what_json_dumps_refuses() -> None:
    """A cycle, a value json can not write, and nesting past the recursion limit: the same error
    with the same message as `json.dumps`."""
    cycle: list[Any] = []
    cycle.append(cycle)
    looped: dict[str, Any] = {}
    looped["a"] = [looped]
    deep: Any = 1
    for _ in range(100_000):
        deep = [deep]
    for value in (cycle, looped, {"a": {1, 2}}, object(), {("a",): 1}, deep):
        expected = _outcome(lambda v: json.dumps(v, ensure_ascii=False), value)
        assert expected[0] != "ok"
        assert _outcome(spaced, value) == expected
    with pytest.raises(ValueError) as refused:
        spaced(cycle)
    assert refused.value.__context__ is None  # json's error, not chained to the C encoder's


@given(NO_FLOATS)
def test_compact_json_without_floats_is_json_dumps_byte_for_byte(value: Any) -> None:
    """Without a float, `compact` writes exactly what compact `json.dumps` writes."""
    assert compact(value) == json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


@given(VALUES)
def test_compact_json_reads_back_as_the_same_value(value: Any) -> None:
    """With floats, `compact` may spell a number otherwise, never change it."""
    assert json.loads(compact(value)) == json.loads(json.dumps(value))


@given(TEXT.filter(bool), st.dictionaries(TEXT, NO_FLOATS, max_size=4))
def test_an_event_is_written_as_it_was(kind: str, fields: dict[str, Any]) -> None:
    """A server-sent event is its name and its compact JSON, as `json.dumps` wrote it."""
    event = {**fields, "type": kind}
    data = json.dumps(event, separators=(",", ":"), ensure_ascii=False)
    assert sse_event(event) == f"event: {kind}\ndata: {data}\n\n".encode()


FUNCTION = {"type": "function", "name": "read", "parameters": {"type": "object"}}
NAMESPACE = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "tools": [{"type": "function", "name": "spawn"}, {"type": "function", "name": "read"}],
}


@pytest.mark.parametrize(
    "tools",
    [
        None,
        [],
        [FUNCTION],
        [FUNCTION, {"type": "web_search"}],
        [NAMESPACE],
        [FUNCTION, NAMESPACE, {"type": "web_search"}],
    ],
)
def test_a_call_is_named_as_the_full_translation_names_it(tools: Any) -> None:
    """An answer names its calls by the tools `naming` reads as by their whole translation:
    without a namespace, each by the name it went upstream by."""
    named, translated = responses_tools.naming(tools), responses_tools.translate(tools)
    for flat in ["read", "spawn", "multi_agent_v1__spawn", "read_1", "other"]:
        assert named.declared(flat) == translated.declared(flat)
    assert named.flat == translated.flat


#: (a chat's `messages`, the field its refusal names, the refusal): every door's job passes here
CHAT_MESSAGES = [
    ([5], "messages[0]", "messages[0] must be an object"),
    (
        [{"content": "x"}],
        "messages[0].role",
        "messages[0].role must be one of assistant, developer, function, system, tool, user",
    ),
    (
        [{"role": "robot", "content": "x"}],
        "messages[0].role",
        "messages[0].role must be one of assistant, developer, function, system, tool, user",
    ),
    (
        [{"role": 5}],
        "messages[0].role",
        "messages[0].role must be one of assistant, developer, function, system, tool, user",
    ),
    (
        [{"role": "user", "content": "x"}, {"role": "user", "content": 5}],
        "messages[1].content",
        "messages[1].content must be a string or an array",
    ),
    (
        [{"role": "user", "content": [5]}],
        "messages[0].content[0]",
        "messages[0].content[0] must be an object with a string 'type'",
    ),
    (
        [{"role": "user", "content": [{"type": "text", "text": 5}]}],
        "messages[0].content[0].text",
        "messages[0].content[0].text must be a string",
    ),
    (
        [{"role": "user", "content": "x"}, {"role": "user", "content": "x", "name": 5}],
        "messages[1].name",
        "messages[1].name must be a string",
    ),
    (
        [{"role": "tool", "content": "x", "tool_call_id": 5}],
        "messages[0].tool_call_id",
        "messages[0].tool_call_id must be a string",
    ),
    (
        [{"role": "assistant", "content": None, "tool_calls": 5}],
        "messages[0].tool_calls",
        "'messages[0].tool_calls' must be an array of objects",
    ),
    (
        [{"role": "assistant", "content": None, "tool_calls": [5]}],
        "messages[0].tool_calls",
        "'messages[0].tool_calls' must be an array of objects",
    ),
    ([], "messages", "'messages' must be a non-empty array"),
    (None, "messages", "'messages' must be a non-empty array"),
]


@pytest.mark.parametrize(("messages", "param", "said"), CHAT_MESSAGES)
def test_a_chat_s_messages_are_refused_as_they_were(messages: Any, param: str, said: str) -> None:
    """A malformed chat message is refused with the words and field it always had."""
    with pytest.raises(BadRequest) as refused:
        chat_fields(messages, {})
    assert (refused.value.param, str(refused.value)) == (param, said)


def test_tool_calls_of_objects_pass() -> None:
    """An assistant's tool calls, a list of objects, pass as they did."""
    messages: list[dict[str, Any]] = [{"role": "assistant", "content": None, "tool_calls": [{}]}]
    assert chat_fields(messages, {}) is messages


def _stream_bytes(body: dict[str, Any], written: Any) -> list[bytes]:
    events = responses_stream.ResponseEvents(
        body, response_id="r", created_at=0, model="m", written=written
    )
    chunk = {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}
    out = events.start() + events.feed(chunk) + events.finish(usage=None)
    return [sse_event(e) for e in out]


@given(
    st.lists(st.dictionaries(TEXT, VALUES, max_size=4), max_size=40),
    st.text(max_size=1000),
    st.sampled_from([{}, {"metadata": {True: "json writes this key, msgspec does not"}}]),
)
@example([{"x": 1.5e-05, "y": "é" * 300}] * 3, "be brief " * 100, {})
@example([{"x": 1.5e-05, "y": "é" * 300}] * 3, "be brief " * 100, {"metadata": {True: "x"}})
def test_a_responses_stream_echoes_what_it_always_wrote(
    tools: list[Any], instructions: str, more: dict[str, Any]
) -> None:
    """A stream whose events echo the request's tools and instructions written once
    (`written_once`) sends the bytes it sends writing them in each event — floats, short values
    and events that only json can write (where the rest goes json's way) included."""
    body: dict[str, Any] = {
        "tools": [{"type": "function", "name": f"t{i}", **t} for i, t in enumerate(tools)]
    }
    body |= {"instructions": instructions, **more}
    assert _stream_bytes(body, written_once) == _stream_bytes(body, None)


def test_long_echoed_members_are_written_once() -> None:
    """What stands for a long member is its compact JSON (so it is not written again per event);
    a short one, or one msgspec can not write, stands for itself."""
    tools = [{"type": "function", "name": f"t{i}", "parameters": {"x": 1.5}} for i in range(40)]
    assert bytes(written_once(tools)) == compact(tools)
    assert written_once("short") == "short"
    odd = [{True: "x" * 600}]
    assert written_once(odd) is odd

"""The simulated providers as an agent sees them: tool calls, JSON answers, n, max_tokens, usage,
embeddings — pure answers, and the same over a fake's real socket."""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path
from typing import Any

import httpx2
import jsonschema  # type: ignore[import-untyped]
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lanes.testing import ANSWER, answer, open_fake, stream_cut
from lanes.testing.answers import choices, chunks, completion, embeddings, tokens
from lanes.testing.schema import instance

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
            "required": ["city"],
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
USER = [{"role": "user", "content": "Weather in Paris?"}]


def test_a_user_turn_with_tools_gets_a_call_of_the_first_tool():
    """The last message is the user's: one well-formed call of the first tool, arguments valid."""
    [choice] = choices({"messages": USER, "tools": [WEATHER, CLOCK]}, ANSWER)
    [call] = choice.tool_calls
    assert choice.finish_reason == "tool_calls" and choice.content is None
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    assert call["id"].startswith("call_")
    jsonschema.validate(
        json.loads(call["function"]["arguments"]), WEATHER["function"]["parameters"]
    )


def test_tool_choice_names_the_tool_or_turns_calls_off():
    """A named tool_choice is the tool called; `none` gets text."""
    named = {"type": "function", "function": {"name": "get_time"}}
    [choice] = choices({"messages": USER, "tools": [WEATHER, CLOCK], "tool_choice": named}, ANSWER)
    assert choice.tool_calls[0]["function"]["name"] == "get_time"
    [choice] = choices({"messages": USER, "tools": [WEATHER], "tool_choice": "none"}, ANSWER)
    assert choice.content == ANSWER and not choice.tool_calls


def test_after_a_tool_result_comes_the_final_answer():
    """A tool result last: the final answer; with tool_choice=required, a tool not yet called."""
    call = choices({"messages": USER, "tools": [WEATHER]}, ANSWER)[0].tool_calls[0]
    turn = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [dict(call)]},
        {"role": "tool", "tool_call_id": call["id"], "content": "sunny"},
    ]
    [final] = choices({"messages": turn, "tools": [WEATHER]}, ANSWER)
    assert final.content == ANSWER and final.finish_reason == "stop"
    [forced] = choices({"messages": turn, "tools": [WEATHER, CLOCK], "tool_choice": "required"}, "")
    assert forced.tool_calls[0]["function"]["name"] == "get_time"


def test_json_object_and_json_schema_answers():
    """json_object answers an object; json_schema a value valid against the schema."""
    [obj] = choices({"messages": USER, "response_format": {"type": "json_object"}}, ANSWER)
    assert json.loads(obj.content or "") == {"answer": ANSWER}
    schema = {
        "type": "object",
        "properties": {"setup": {"type": "string"}, "rating": {"type": "integer", "maximum": -3}},
        "required": ["setup", "rating"],
        "additionalProperties": False,
    }
    spec = {"type": "json_schema", "json_schema": {"name": "joke", "schema": schema}}
    [answered] = choices({"messages": USER, "response_format": spec}, ANSWER)
    value = json.loads(answered.content or "")
    jsonschema.validate(value, schema)
    assert value["setup"] == "setup"


def test_n_choices_and_max_tokens_truncation():
    """n gives n choices; max_tokens cuts the answer with finish_reason length; usage counts it."""
    body = completion({"messages": USER, "n": 3, "max_tokens": 2}, ANSWER, "m")
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert {c["finish_reason"] for c in body["choices"]} == {"length"}
    assert body["choices"][0]["message"]["content"] == ANSWER[:8]
    assert body["usage"]["completion_tokens"] == 3 * tokens(ANSWER[:8]) == 6
    whole = completion({"messages": USER, "max_tokens": tokens(ANSWER)}, ANSWER, "m")
    assert whole["choices"][0]["finish_reason"] == "stop"


def reassemble(stream: list[dict[str, Any]]) -> tuple[str, list[tuple[str, str, str]], str | None]:
    """(text, [(id, name, arguments)], finish) of choice 0 in a list of chunks."""
    text, finish = "", None
    calls: dict[int, list[str]] = {}
    for c in stream:
        for choice in c["choices"]:
            if choice["index"]:
                continue
            delta = choice["delta"]
            text += delta.get("content") or ""
            for call in delta.get("tool_calls") or ():
                got = calls.setdefault(call["index"], ["", "", ""])
                got[0] = call.get("id") or got[0]
                got[1] = (call.get("function") or {}).get("name") or got[1]
                got[2] += (call.get("function") or {}).get("arguments") or ""
            finish = choice["finish_reason"] or finish
    return text, [(v[0], v[1], v[2]) for v in calls.values()], finish


@given(
    tools=st.booleans(),
    n=st.integers(1, 3),
    cap=st.none() | st.integers(1, 30),
    text=st.text(st.characters(codec="utf-8"), min_size=1, max_size=60),
)
def test_a_stream_says_what_the_completion_says(tools, n, cap, text):
    """Streamed chunks reassemble into exactly the non-streamed choice, with usage at the end."""
    request: dict[str, Any] = {"messages": USER, "n": n, "tools": [WEATHER] if tools else None}
    if cap is not None:
        request["max_tokens"] = cap
    body = completion(request, text, "m")
    streamed = chunks(request, text, "m")
    content, calls, finish = reassemble(streamed)
    message = body["choices"][0]["message"]
    assert content == (message["content"] or "")
    assert calls == [
        (c["id"], c["function"]["name"], c["function"]["arguments"])
        for c in message.get("tool_calls") or ()
    ]
    assert finish == body["choices"][0]["finish_reason"]
    assert streamed[-1]["usage"] == body["usage"]


def test_embeddings_are_deterministic_unit_vectors():
    """One vector per input, the same for the same input, `dimensions` and base64 honoured."""
    body = embeddings({"input": ["a", "b", "a"], "dimensions": 8}, "e")
    vectors = [d["embedding"] for d in body["data"]]
    assert len(vectors) == 3 and all(len(v) == 8 for v in vectors)
    assert vectors[0] == vectors[2] != vectors[1]
    assert sum(x * x for x in vectors[0]) == pytest.approx(1.0)
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0
    encoded = embeddings({"input": "a", "dimensions": 8, "encoding_format": "base64"}, "e")
    decoded = struct.unpack("<8f", base64.b64decode(encoded["data"][0]["embedding"]))
    assert decoded == pytest.approx(vectors[0], abs=1e-6)
    assert len(embeddings({"input": [1, 2, 3]}, "e")["data"]) == 1  # one input of token ids


# -- a value valid against any schema -------------------------------------------------------------

LEAVES = st.one_of(
    st.just({"type": "string"}),
    st.builds(
        lambda lo, extra: {"type": "string", "minLength": lo, "maxLength": lo + extra},
        st.integers(0, 5),
        st.integers(0, 5),
    ),
    st.sampled_from(
        [
            {"type": "string", "format": "date-time"},
            {"type": "string", "format": "email"},
            {"type": "string", "pattern": "^[0-9]+$"},
            {"type": "boolean"},
            {"type": "null"},
            {"type": ["string", "null"]},
            {"enum": ["red", "green", 3]},
            {"const": {"fixed": True}},
        ]
    ),
    st.builds(
        lambda lo, span, exclusive, step: {
            "type": "integer",
            "minimum": lo,
            "maximum": lo + span,
            **({"exclusiveMinimum": lo} if exclusive else {}),
            **({"multipleOf": step} if step else {}),
        },
        st.integers(-50, 50),
        st.integers(3, 40),
        st.booleans(),
        st.sampled_from([None, 2, 3]),
    ),
    st.builds(
        lambda lo, step: {
            "type": "number",
            "minimum": lo,
            **({"multipleOf": step} if step else {}),
        },
        st.floats(-100, 100, allow_nan=False),
        st.sampled_from([None, 0.5, 0.25]),
    ),
)


def _object(children):
    return st.dictionaries(
        st.from_regex(r"[a-z]{1,8}", fullmatch=True), children, max_size=4
    ).flatmap(
        lambda props: st.builds(
            lambda required, closed: {
                "type": "object",
                "properties": props,
                "required": required,
                **({"additionalProperties": False} if closed else {}),
            },
            st.lists(st.sampled_from(sorted(props)), unique=True) if props else st.just([]),
            st.booleans(),
        )
    )


SCHEMAS = st.recursive(
    LEAVES,
    lambda children: st.one_of(
        _object(children),
        st.builds(
            lambda items, lo: {"type": "array", "items": items, "minItems": lo},
            children,
            st.integers(0, 3),
        ),
        st.builds(lambda a, b: {"anyOf": [a, b]}, children, children),
        st.builds(lambda a: {"allOf": [a]}, _object(children)),
    ),
    max_leaves=12,
)


@given(SCHEMAS)
def test_the_value_is_valid_against_the_schema(schema):
    """Whatever the schema (objects, arrays, unions, bounds, formats, enums), the value is valid."""
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    assert [e.message for e in validator.iter_errors(instance(schema))] == []


@pytest.mark.parametrize(
    "items",
    [{"type": "string"}, {"type": "integer", "maximum": 0}, {"enum": ["a", "b", "c"]}],
)
def test_unique_items_are_distinct(items):
    """uniqueItems with several items required: each item differs."""
    schema = {"type": "array", "items": items, "minItems": 3, "uniqueItems": True}
    jsonschema.validate(instance(schema), schema)


def test_refs_and_recursive_schemas_end():
    """$ref into $defs is followed, and a recursive schema still gives a finite valid value."""
    schema = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                },
                "required": ["name", "children"],
            }
        },
        "$ref": "#/$defs/node",
    }
    value = instance(schema)
    jsonschema.validate(value, schema)
    assert value["name"] == "name"


# -- over a real socket ---------------------------------------------------------------------------


async def test_a_fake_streams_a_tool_call_and_embeds_over_http():
    """The fake provider streams the tool call and serves /embeddings on its loopback socket."""
    async with open_fake("sim", models=("m", "e")) as fake, httpx2.AsyncClient() as http:
        body = {"model": "m", "messages": USER, "tools": [WEATHER], "stream": True}
        response = await http.post(f"{fake.base_url}/chat/completions", json=body)
        events = [
            json.loads(line[6:])
            for line in response.text.splitlines()
            if line.startswith("data: {")
        ]
        text, calls, finish = reassemble(events)
        vectors = await http.post(f"{fake.base_url}/embeddings", json={"model": "e", "input": "x"})
    assert finish == "tool_calls" and calls[0][1] == "get_weather" and text == ""
    assert vectors.json()["data"][0]["object"] == "embedding"
    assert [r.path for r in fake.requests()] == ["/v1/chat/completions", "/v1/embeddings"]


async def test_failure_behaviours_still_fail_with_tools():
    """A scripted cut still cuts a tool-call stream: the drills keep their faults."""
    async with open_fake("sim", models=("m",)) as fake, httpx2.AsyncClient() as http:
        fake.script("m", stream_cut(after=2), answer())
        body = {"model": "m", "messages": USER, "tools": [WEATHER], "stream": True}
        with pytest.raises(httpx2.RemoteProtocolError):
            await http.post(f"{fake.base_url}/chat/completions", json=body)
        again = await http.post(f"{fake.base_url}/chat/completions", json=body)
    assert b"[DONE]" in again.content


NUMBERS = st.builds(
    lambda lo, step, name: {
        "type": "object",
        "properties": {name: {"type": "number", **lo, **step}},
        "required": [name],
    },
    st.sampled_from([{}, {"minimum": 0}, {"minimum": 3}, {"minimum": 0.5}, {"maximum": -2.5}]),
    st.sampled_from([{}, {"multipleOf": 1}, {"multipleOf": 0.25}]),
    st.sampled_from(["yield_time_ms", "max_output_tokens", "ratio"]),
)


@given(NUMBERS)
def test_a_whole_number_is_written_whole(schema):
    """A `number` whose value is whole comes as a JSON integer (a Rust usize reads it), and
    still validates; only a bound that needs a fraction gives one."""
    value = next(iter(instance(schema).values()))
    jsonschema.validate(value, schema["properties"][next(iter(schema["properties"]))])
    assert isinstance(value, int) or not float(value).is_integer()


def test_codexs_count_arguments_are_integers():
    """The arguments of Codex's exec_command call carry its counts as integers, not 0.0."""
    body = json.loads((Path(__file__).parent / "fixtures/clients/codex-0.json").read_text())
    [exec_command] = [t for t in body["body"]["tools"] if t.get("name") == "exec_command"]
    arguments = instance(exec_command["parameters"])
    assert json.dumps(arguments["yield_time_ms"]) == "0"
    assert isinstance(arguments["max_output_tokens"], int)


def test_a_system_message_after_the_user_still_gets_the_tool_call():
    """A system entry after the user's message (Claude Code's) does not stop the tool call."""
    request = {
        "messages": [
            {"role": "user", "content": "list the files"},
            {"role": "system", "content": "reminder"},
        ],
        "tools": [{"type": "function", "function": {"name": "Bash", "parameters": {}}}],
    }
    [choice] = choices(request, "text")
    assert choice.tool_calls[0]["function"]["name"] == "Bash"

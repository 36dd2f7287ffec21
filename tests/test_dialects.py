"""The Responses and Messages translations, pure: requests into chat completions, answers and
streams back — a stream always says what the whole answer says."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from helpers import examples
from lanes._core.dialects import (
    messages_api,
    messages_reply,
    responses_api,
    responses_reply,
    responses_stream,
)
from lanes._core.dialects.call_ids import restored
from lanes._core.dialects.common import BadField
from lanes.testing.answers import chunks, completion

WEATHER_CHAT = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TEXT = st.text(st.characters(codec="utf-8"), min_size=1, max_size=40)
JSON_TEXT = st.dictionaries(
    st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3
).map(json.dumps)


# -- Responses: requests ---------------------------------------------------------------------------


def test_a_string_input_with_instructions_becomes_a_chat():
    """input as a string and instructions: a system message and a user message; params mapped."""
    chat = responses_api.to_chat(
        {
            "model": "fast",
            "input": "Hi",
            "instructions": "Be brief",
            "max_output_tokens": 50,
            "temperature": 0.2,
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
            "store": True,
            "metadata": {"k": "v"},
        }
    )
    assert chat.model == "fast" and not chat.stream
    assert chat.messages == [
        {"role": "system", "content": "Be brief"},
        {"role": "user", "content": "Hi"},
    ]
    assert chat.params == {
        "temperature": 0.2,
        "max_tokens": 50,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "object"}},
        },
    }


def test_function_calls_and_outputs_become_tool_calls_and_tool_messages():
    """An assistant turn's function calls join one assistant message; outputs are tool messages."""
    chat = responses_api.to_chat(
        {
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "Let me see."}],
                },
                {"type": "function_call", "call_id": "c1", "name": "w", "arguments": '{"a":1}'},
                {"type": "function_call", "call_id": "c2", "name": "w", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                {
                    "type": "function_call_output",
                    "call_id": "c2",
                    "output": [{"type": "input_text", "text": "rain"}],
                },
                {"type": "reasoning", "id": "r", "summary": []},
            ],
            "tools": [
                {"type": "function", "name": "w", "parameters": {"type": "object"}, "strict": True}
            ],
            "tool_choice": {"type": "function", "name": "w"},
            "parallel_tool_calls": False,
        }
    )
    assert chat.messages == [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "Let me see.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "w", "arguments": '{"a":1}'}},
                {"id": "c2", "type": "function", "function": {"name": "w", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "rain"},
    ]
    assert chat.params["tools"] == [
        {
            "type": "function",
            "function": {"name": "w", "parameters": {"type": "object"}, "strict": True},
        }
    ]
    assert chat.params["tool_choice"] == {"type": "function", "function": {"name": "w"}}
    assert chat.params["parallel_tool_calls"] is False


def test_an_image_input_keeps_its_url():
    """input_image parts become image_url parts of a user message."""
    chat = responses_api.to_chat(
        {
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "What is it?"},
                        {
                            "type": "input_image",
                            "image_url": "data:image/png;base64,AA==",
                            "detail": "low",
                        },
                    ],
                }
            ]
        }
    )
    assert chat.messages[0]["content"][1] == {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64,AA==", "detail": "low"},
    }


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": "x", "conversation": "conv_1"}, "conversation"),
        ({"input": "x", "background": True}, "background"),
        ({"input": "x", "prompt": {"id": "pmpt_1"}}, "prompt"),
        (
            {
                "input": "x",
                "tools": [{"type": "web_search"}],
                "tool_choice": {"type": "web_search"},
            },
            "tool_choice",
        ),
        (
            {"input": "x", "tools": [{"type": "web_search"}], "tool_choice": "required"},
            "tool_choice",
        ),
        ({"input": "x", "tools": [{"type": "mcp", "server_label": "docs"}]}, "tools[0].type"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input[0].content[0].type",
        ),
        ({"input": []}, "input"),
        ({}, "input"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
        ({"input": "x", "tool_choice": {"type": "allowed_tools"}}, "tool_choice"),
        (
            {"input": [{"type": "function_call", "name": "w", "arguments": "{}"}]},
            "input[0].call_id",
        ),
    ],
)
def test_what_can_not_be_carried_is_refused_by_name(body, param):
    """Stateful features, a forced built-in tool, hosted MCP and bad items: a BadField naming it."""
    with pytest.raises(BadField) as caught:
        responses_api.to_chat(body)
    assert caught.value.param == param


# -- Responses: answers and streams ----------------------------------------------------------------

REQUESTS = st.fixed_dictionaries(
    {
        "tools": st.booleans(),
        "cap": st.none() | st.integers(1, 20),
        "text": TEXT | st.just(""),
        "usage": st.booleans(),
    }
)


def chat_request(spec: dict[str, Any]) -> dict[str, Any]:
    request: dict[str, Any] = {"messages": [{"role": "user", "content": "q"}]}
    if spec["tools"]:
        request["tools"] = [WEATHER_CHAT]
    if spec["cap"] is not None:
        request["max_tokens"] = spec["cap"]
    return request


@given(REQUESTS, st.integers(1, 5))
def test_a_responses_stream_ends_as_the_whole_response(spec, split):
    """Fed the chunks of an answer, the stream's final response has exactly the output, status and
    usage of the response made from the whole completion; deltas add up; sequence numbers count."""
    request = chat_request(spec)
    whole = completion(request, spec["text"], "m")
    streamed = chunks(request, spec["text"], "m")
    if not spec["usage"]:
        del whole["usage"], streamed[-1]["usage"]
    expected = responses_reply.response_of(
        {"model": "auto"}, whole, response_id="r", created_at=7.9
    )
    events = responses_stream.ResponseEvents(
        {"model": "auto"}, response_id="r", created_at=7.9, model="auto"
    )
    out = events.start()
    for i in range(0, len(streamed), split):  # a chunk at a time, or several arriving together
        for chunk in streamed[i : i + split]:
            out += events.feed(chunk)
    out += events.finish()
    final = out[-1]["response"]
    assert out[0]["type"] == "response.created" and out[-1]["type"] in (
        "response.completed",
        "response.incomplete",
    )
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    for key in ("output", "status", "incomplete_details", "usage", "model", "created_at"):
        assert final[key] == expected[key], key
    deltas = "".join(e["delta"] for e in out if e["type"] == "response.output_text.delta")
    arguments = "".join(
        e["delta"] for e in out if e["type"] == "response.function_call_arguments.delta"
    )
    message = whole["choices"][0]["message"]
    assert deltas == (message["content"] or "")
    assert arguments == "".join(c["function"]["arguments"] for c in message.get("tool_calls") or ())


#: What a provider adds to a tool call: nothing, or Gemini 3's signature (and what else it may).
EXTRA_CONTENT = st.none() | st.builds(
    lambda signature, more: {"google": {"thought_signature": signature, **more}},
    st.text("ABCxyz019+/", min_size=1, max_size=300),
    st.dictionaries(st.sampled_from(["thought", "x"]), st.booleans()),
)


def _tool_call(call_id: str, name: str, arguments: str, extra: Any) -> dict[str, Any]:
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    return call if extra is None else {**call, "extra_content": extra}


ASSISTANT_TURNS = st.one_of(
    TEXT.map(lambda text: {"role": "assistant", "content": text}),
    st.lists(
        st.tuples(
            st.text("abcxyz0189", min_size=4, max_size=4).map(lambda tail: f"call_{tail}"),
            st.sampled_from(["f", "g"]),
            JSON_TEXT,
            EXTRA_CONTENT,
        ),
        min_size=1,
        max_size=3,
        unique_by=lambda call: call[0],
    ).map(
        lambda calls: {
            "role": "assistant",
            "content": None,
            "tool_calls": [_tool_call(*call) for call in calls],
        }
    ),
)


@given(ASSISTANT_TURNS)
def test_a_responses_output_fed_back_is_the_same_turn(turn):
    """A response's output items, sent back as the next request's input (as agents do), become the
    very assistant message the upstream answered — each call's id and extra content (Gemini's
    thought signature, carried in the call_id) too."""
    completion_ = {"model": "m", "choices": [{"message": turn, "finish_reason": "stop"}]}
    output = responses_reply.response_of({}, completion_, response_id="r", created_at=0)["output"]
    chat = responses_api.to_chat({"input": [{"role": "user", "content": "q"}, *output]})
    assert chat.messages[1] == turn


def test_a_truncated_answer_is_an_incomplete_response():
    """finish_reason length: status incomplete, reason max_output_tokens."""
    whole = completion(
        {"messages": [{"role": "user", "content": "q"}], "max_tokens": 1}, "long answer", "m"
    )
    response = responses_reply.response_of({}, whole, response_id="r", created_at=0)
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["usage"]["output_tokens"] == 1


def test_a_broken_stream_ends_with_the_error_event_and_a_failed_response():
    """fail(): the in-band `error` event, then `response.failed` keeping what was delivered."""
    events = responses_stream.ResponseEvents({}, response_id="r", created_at=0, model="m")
    events.start()
    for chunk in chunks({"messages": []}, "partial answer", "m")[:2]:
        events.feed(chunk)
    error, failed = events.fail("stream_interrupted", "a/b: stream cut after 2 chunk(s)")
    assert error["type"] == "error" and error["code"] == "stream_interrupted"
    assert failed["type"] == "response.failed" and failed["response"]["status"] == "failed"
    assert failed["response"]["error"]["message"].startswith("a/b: stream cut")
    assert failed["response"]["output"][0]["status"] == "incomplete"
    assert failed["response"]["output"][0]["content"][0]["text"] == "partial"
    assert failed["sequence_number"] == error["sequence_number"] + 1


# -- Messages: requests ----------------------------------------------------------------------------


def test_a_messages_request_becomes_a_chat():
    """system, text, images, tool_use, tool_result, tools, tool_choice, stop_sequences, metadata."""
    chat = messages_api.to_chat(
        {
            "model": "claude-haiku-4-5",
            "max_tokens": 100,
            "system": [
                {"type": "text", "text": "Be brief", "cache_control": {"type": "ephemeral"}}
            ],
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Weather?"},
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "AA=="},
                        },
                    ],
                },
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hmm", "signature": "s"},
                        {"type": "text", "text": "Checking."},
                        {"type": "tool_use", "id": "t1", "name": "w", "input": {"city": "Paris"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": [{"type": "text", "text": "sunny"}],
                        },
                        {"type": "text", "text": "Thanks"},
                    ],
                },
            ],
            "tools": [{"name": "w", "description": "weather", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
            "stop_sequences": ["END"],
            "metadata": {"user_id": "u1"},
            "top_k": 5,
            "thinking": {"type": "enabled", "budget_tokens": 1024},
        }
    )
    assert chat.model == "claude-haiku-4-5"
    assert chat.messages == [
        {"role": "system", "content": "Be brief"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Weather?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}},
            ],
        },
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "w", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "sunny"},
        {"role": "user", "content": "Thanks"},
    ]
    assert chat.params == {
        "max_tokens": 100,
        "stop": ["END"],
        "user": "u1",
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "w",
                    "parameters": {"type": "object"},
                    "description": "weather",
                },
            }
        ],
        "tool_choice": "required",
        "parallel_tool_calls": False,
    }


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}, "model"),
        ({"model": "m", "max_tokens": 5, "messages": []}, "messages"),
        (
            {"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]},
            "messages",
        ),
        (
            {"model": "m", "max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]},
            "messages.0.role",
        ),
        (
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": [{"type": "document"}]}],
            },
            "messages.0.content.0.type",
        ),
        (
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "web_search_20250305", "name": "web_search"}],
                "tool_choice": {"type": "tool", "name": "web_search"},
            },
            "tool_choice.name",
        ),
        (
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "web_search_20250305", "name": "web_search"}],
                "tool_choice": {"type": "any"},
            },
            "tool_choice.type",
        ),
        (
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "x"}],
                "mcp_servers": [{"type": "url", "url": "https://mcp.example", "name": "m"}],
            },
            "mcp_servers",
        ),
        (
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "x"}],
                "output_config": {"format": {"type": "yaml"}},
            },
            "output_config.format.type",
        ),
        (
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "x"}],
                "tool_choice": {"type": "maybe"},
            },
            "tool_choice.type",
        ),
    ],
)
def test_messages_requests_that_can_not_be_carried_name_the_field(body, param):
    """A missing max_tokens or model, a forced server tool, MCP servers, documents, a format
    other than a JSON schema: BadField by name."""
    with pytest.raises(BadField) as caught:
        messages_api.to_chat(body)
    assert caught.value.param == param


JSON_OBJECTS = st.dictionaries(
    st.text(min_size=1, max_size=8),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=10),
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
        ),
        max_leaves=8,
    ),
    max_size=4,
)


@given(JSON_OBJECTS, st.text(min_size=1, max_size=10))
def test_a_tool_use_survives_the_round_trip(arguments, name):
    """tool_use → chat tool call → answered back as tool_use: the same name and input."""
    chat = messages_api.to_chat(
        {
            "model": "m",
            "max_tokens": 5,
            "messages": [
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t", "name": name, "input": arguments}],
                }
            ],
        }
    )
    answered = {"choices": [{"message": chat.messages[0], "finish_reason": "tool_calls"}]}
    message = messages_reply.message_of(answered, message_id="msg_1", model="m")
    assert message["content"] == [{"type": "tool_use", "id": "t", "name": name, "input": arguments}]
    assert message["stop_reason"] == "tool_use"


def accumulate(events: list[dict[str, Any]]) -> dict[str, Any]:
    """What a Messages client builds from the events (as the SDK's stream accumulates them)."""
    message: dict[str, Any] = {}
    partial: dict[int, str] = {}
    for event in events:
        kind = event["type"]
        if kind == "message_start":
            message = {**event["message"], "content": []}
        elif kind == "content_block_start":
            message["content"].append(dict(event["content_block"]))
        elif kind == "content_block_delta":
            block, delta = message["content"][event["index"]], event["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            else:
                partial[event["index"]] = partial.get(event["index"], "") + delta["partial_json"]
        elif kind == "content_block_stop" and event["index"] in partial:
            message["content"][event["index"]]["input"] = json.loads(
                partial[event["index"]] or "{}"
            )
        elif kind == "message_delta":
            message.update(event["delta"])
            message["usage"] = {**message["usage"], **event["usage"]}
    return message


@given(REQUESTS, st.integers(1, 5))
def test_a_messages_stream_builds_the_whole_message(spec, split):
    """The events of a stream accumulate into exactly the message made from the whole completion,
    and arrive in Messages API order: start, blocks, delta, stop."""
    assume(not (spec["tools"] and spec["cap"]))  # arguments cut short are not JSON to compare
    request = chat_request(spec)
    whole = completion(request, spec["text"], "m")
    streamed = chunks(request, spec["text"], "m")
    expected = messages_reply.message_of(whole, message_id="msg_1", model="m")
    events = messages_reply.MessageEvents(message_id="msg_1", model="m")
    out = events.start()
    for i in range(0, len(streamed), split):
        for chunk in streamed[i : i + split]:
            out += events.feed(chunk)
    out += events.finish()
    kinds = [e["type"] for e in out]
    assert kinds[:2] == ["message_start", "ping"] and kinds[-2:] == [
        "message_delta",
        "message_stop",
    ]
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") >= 1
    assert accumulate(out) == expected


def test_a_messages_error_event_names_its_type():
    """fail(): one `error` event in the Messages API's shape."""
    [event] = messages_reply.MessageEvents(message_id="m", model="m").fail("api_error", "cut")
    assert event == {"type": "error", "error": {"type": "api_error", "message": "cut"}}


@pytest.mark.parametrize("kind", [{}, ["message"], {"a": "b" * 100_000}])
def test_an_input_item_type_of_the_wrong_type_is_a_400_naming_it(kind):
    """`/v1/responses` with `input: [{"type": {}}]`: a 400 naming `input[0].type`, with the value
    shown at most briefly. It raised TypeError (a dict is no member of a set): a 500 from the
    sidecar, and a traceback in its log, for any client's malformed item."""
    with pytest.raises(BadField) as refused:
        responses_api.to_chat({"input": [{"type": kind}]})
    assert refused.value.param == "input[0].type"
    assert len(str(refused.value)) < 300


def test_a_tool_results_images_follow_it_as_a_user_message():
    """A `tool` message holds text only: a tool_result's images (Claude Code's Read of a
    screenshot) go in a user message right after the tool messages, before the turn's own
    text, and the tool message says they follow."""
    png = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}
    request = messages_api.to_chat(
        {
            "model": "m",
            "max_tokens": 10,
            "messages": [
                {"role": "user", "content": "look"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {}}],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": [
                                {"type": "text", "text": "shot.png"},
                                {"type": "image", "source": png},
                            ],
                        },
                        {"type": "text", "text": "what is in it?"},
                    ],
                },
            ],
        }
    )
    tool, user = request.messages[-2:]
    assert tool["role"] == "tool" and tool["tool_call_id"] == "t1"
    assert tool["content"].startswith("shot.png\n") and "follow" in tool["content"]
    assert user == {
        "role": "user",
        "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            {"type": "text", "text": "what is in it?"},
        ],
    }


def _parsed(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool calls with their arguments parsed (the Messages API carries them as an object)."""
    return [
        {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
        for c in calls
    ]


@settings(max_examples=examples(100))
@given(ASSISTANT_TURNS)
def test_a_messages_answer_fed_back_is_the_same_turn(turn):
    """A message's content blocks, sent back as the next request's assistant turn with a
    tool_result for each call (as Claude Code does), become the assistant message the upstream
    answered — each call's id and extra content (carried in the tool_use id) too — and the
    results answer those ids."""
    answered = {"model": "m", "choices": [{"message": turn, "finish_reason": "stop"}]}
    blocks = messages_reply.message_of(answered, message_id="msg_1", model="m")["content"]
    uses = [b["id"] for b in blocks if b["type"] == "tool_use"]
    results = [{"type": "tool_result", "tool_use_id": use, "content": "ok"} for use in uses]
    back = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": blocks},
        *([{"role": "user", "content": results}] if results else []),
    ]
    chat = messages_api.to_chat({"model": "m", "max_tokens": 5, "messages": back})
    assistant, *tools = chat.messages[1:]
    assert _parsed(assistant.get("tool_calls", [])) == _parsed(turn.get("tool_calls", []))
    assert [m["tool_call_id"] for m in tools] == [c["id"] for c in turn.get("tool_calls", [])]


def test_a_signed_call_streamed_gets_the_id_it_gets_whole():
    """Tool calls with extra content, streamed (as Gemini streams one: whole, in one chunk), reach
    a Messages and a Responses client under the ids they have in the whole answer: a signed call's
    restores the upstream's id and extra content; an unsigned one's (Gemini's `{"google": {}}`)
    is the upstream's id, as it is."""
    signed = _tool_call("fc-1", "f", "{}", {"google": {"thought_signature": "c2ln"}})
    unsigned = _tool_call("fc-2", "f", "{}", {"google": {}})
    message: dict[str, Any] = {
        "role": "assistant",
        "content": None,
        "tool_calls": [signed, unsigned],
    }
    whole = {"model": "m", "choices": [{"message": message, "finish_reason": "tool_calls"}]}
    streamed = [
        {"model": "m", "choices": [{"index": 0, "delta": {"tool_calls": [{**call, "index": k}]}}]}
        for k, call in enumerate(message["tool_calls"])
    ]
    events = messages_reply.MessageEvents(message_id="msg_1", model="m")
    said = events.start() + [e for c in streamed for e in events.feed(c)] + events.finish()
    uses = [
        b["id"] for b in messages_reply.message_of(whole, message_id="msg_1", model="m")["content"]
    ]
    started = [e["content_block"]["id"] for e in said if e["type"] == "content_block_start"]
    responses = responses_stream.ResponseEvents({}, response_id="r", created_at=0, model="m")
    told = responses.start() + [e for c in streamed for e in responses.feed(c)]
    output = responses_reply.response_of({}, whole, response_id="r", created_at=0)["output"]
    added = [e["item"]["call_id"] for e in told if e["type"] == "response.output_item.added"]
    assert uses == started == [i["call_id"] for i in output] == added
    assert [restored(u) for u in uses] == [("fc-1", signed["extra_content"]), ("fc-2", None)]
    assert uses[1] == "fc-2"

"""Gemini's API translated, pure: requests into chat completions (camelCase or snake_case, every
unknown field dropped and named, never refused), answers and streams back — a stream says what
the whole answer says, and a function call's id comes back with its response."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import examples
from lanes._core.dialects import gemini_api, gemini_reply, gemini_tools
from lanes._core.dialects.common import BadField
from lanes.testing.answers import chunks, completion

NAMES = st.sampled_from(["get_weather", "list_dir", "read_file"])
TEXT = st.text(st.characters(codec="utf-8"), min_size=1, max_size=40)
WEATHER = {
    "functionDeclarations": [
        {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "OBJECT",
                "properties": {"city": {"type": "STRING", "nullable": True}},
                "required": ["city"],
                "propertyOrdering": ["city"],
            },
        }
    ]
}


def chat(body: dict[str, Any], stream: bool = False) -> Any:
    return gemini_api.to_chat(body, model="gemini-2.5-flash", stream=stream)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "parts": [{"text": text}]}


# -- requests --------------------------------------------------------------------------------------


def test_contents_system_and_generation_config_become_a_chat():
    """systemInstruction a system message, text parts the turns, generationConfig its chat
    parameters; the model and streaming come from the path."""
    request = chat(
        {
            "systemInstruction": {"parts": [{"text": "Be brief."}, {"text": "Be kind."}]},
            "contents": [
                user("Hi"),
                {"role": "model", "parts": [{"text": "Hello."}]},
                {"role": "user", "parts": [{"text": "Again, "}, {"text": "please."}]},
            ],
            "generationConfig": {
                "temperature": 0.5,
                "topP": 0.9,
                "topK": 40,
                "maxOutputTokens": 100,
                "stopSequences": ["END"],
                "seed": 7,
                "candidateCount": 1,
            },
        },
        stream=True,
    )
    assert request.model == "gemini-2.5-flash" and request.stream
    assert request.messages == [
        {"role": "system", "content": "Be brief.\nBe kind."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Again, please."},
    ]
    assert request.params == {
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 40,
        "seed": 7,
        "max_tokens": 100,
        "stop": ["END"],
    }
    assert request.dropped == ()


def test_snake_case_names_are_read_as_their_camel_case():
    """proto3 JSON's other spelling (system_instruction, inline_data, max_output_tokens, …) is the
    same request."""
    camel = chat(
        {
            "systemInstruction": {"parts": [{"text": "S"}]},
            "contents": [
                {
                    "parts": [
                        {"text": "Look"},
                        {"inlineData": {"mimeType": "image/png", "data": "AA"}},
                    ]
                }
            ],
            "generationConfig": {"maxOutputTokens": 9, "responseMimeType": "application/json"},
        }
    )
    snake = chat(
        {
            "system_instruction": {"parts": [{"text": "S"}]},
            "contents": [
                {
                    "parts": [
                        {"text": "Look"},
                        {"inline_data": {"mime_type": "image/png", "data": "AA"}},
                    ]
                }
            ],
            "generation_config": {"max_output_tokens": 9, "response_mime_type": "application/json"},
        }
    )
    assert camel == snake
    assert camel.messages[1]["content"][1] == {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64,AA"},
    }
    assert camel.params["response_format"] == {"type": "json_object"}


@settings(max_examples=examples(200))
@given(
    top=st.dictionaries(st.from_regex(r"[a-z][a-zA-Z]{0,12}", fullmatch=True), st.integers()),
    config=st.dictionaries(st.from_regex(r"x[a-zA-Z]{0,12}", fullmatch=True), st.booleans()),
    part=st.dictionaries(st.from_regex(r"z[a-zA-Z]{0,12}", fullmatch=True), st.text(max_size=3)),
)
def test_unknown_fields_are_dropped_and_named_never_refused(top, config, part):
    """Any field lanes does not read — at the top, in generationConfig, in a part — is left out
    and named; the request is still served."""
    top = {k: v for k, v in top.items() if gemini_tools.camel(k) not in gemini_api.TRANSLATED}
    top.pop("cachedContent", None)
    body = {
        **top,
        "contents": [{"role": "user", "parts": [{"text": "Hi", **part}]}],
        "generationConfig": {"temperature": 1, **config},
        "safetySettings": [{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_NONE"}],
    }
    request = chat(body)
    assert request.messages == [{"role": "user", "content": "Hi"}]
    assert request.params == {"temperature": 1}
    named = set(request.dropped)
    assert {gemini_tools.camel(k) for k in top} | {"safetySettings"} <= named
    assert {f"generationConfig.{gemini_tools.camel(k)}" for k in config} <= named
    assert {f"contents.parts.{gemini_tools.camel(k)}" for k in part} <= named


def test_thoughts_signatures_and_thinking_config_are_dropped_and_named():
    """A thought part, a thoughtSignature and thinkingConfig go nowhere upstream, and are named."""
    request = chat(
        {
            "contents": [
                user("Hi"),
                {
                    "role": "model",
                    "parts": [
                        {"text": "pondering", "thought": True},
                        {"text": "Hello.", "thoughtSignature": "c2ln"},
                    ],
                },
                user("Go on"),
            ],
            "generationConfig": {"thinkingConfig": {"thinkingBudget": 0, "includeThoughts": True}},
        }
    )
    assert request.messages[1] == {"role": "assistant", "content": "Hello."}
    assert set(request.dropped) == {
        "contents.parts.thought",
        "contents.parts.thoughtSignature",
        "generationConfig.thinkingConfig",
    }
    assert gemini_api.thoughts({"generationConfig": {"thinkingConfig": {"includeThoughts": True}}})


@settings(max_examples=examples(200))
@given(
    turns=st.lists(st.lists(NAMES, min_size=1, max_size=4), min_size=1, max_size=4),
    with_ids=st.booleans(),
    data=st.data(),
)
def test_every_function_response_answers_the_call_it_follows(turns, with_ids, data):
    """Model turns of function calls (with or without ids), each answered in the next user turn
    (in any order when the response names the id, in order of each name when it does not): every
    tool message names the id of its call, and no two calls share an id."""
    contents: list[dict[str, Any]] = [user("Start")]
    expected: list[list[tuple[str, str]]] = []
    for t, names in enumerate(turns):
        calls = [
            {"name": n, "args": {"k": k}, **({"id": f"id-{t}-{k}"} if with_ids else {})}
            for k, n in enumerate(names)
        ]
        contents.append({"role": "model", "parts": [{"functionCall": c} for c in calls]})
        order = data.draw(st.permutations(range(len(calls)))) if with_ids else range(len(calls))
        responses = [
            {
                "name": calls[k]["name"],
                "response": {"k": k},
                **({"id": calls[k]["id"]} if with_ids else {}),
            }
            for k in order
        ]
        contents.append({"role": "user", "parts": [{"functionResponse": r} for r in responses]})
        expected.append([(json.dumps({"k": k}), calls[k]["name"]) for k in order])
    messages = chat({"contents": contents}).messages
    ids_by_call: dict[str, tuple[str, str]] = {}
    for message in messages:
        for call in message.get("tool_calls") or ():
            ids_by_call[call["id"]] = (call["function"]["arguments"], call["function"]["name"])
    assert len(ids_by_call) == sum(len(names) for names in turns)  # unique ids
    tools = [m for m in messages if m["role"] == "tool"]
    answered = [(m["content"], ids_by_call[m["tool_call_id"]]) for m in tools]
    for content, (arguments, _) in answered:
        assert json.loads(content) == json.loads(arguments)  # each answers its own call
    assert [n for row in expected for _, n in row] == [name for _, (_, name) in answered]


def test_function_declarations_and_tool_config_become_chat_tools():
    """Gemini's Schema is JSON Schema upstream (lower-case types, nullable as null, no
    propertyOrdering); ANY with one allowed name forces that function; built-in tools are
    dropped and named."""
    request = chat(
        {
            "contents": [user("Weather?")],
            "tools": [WEATHER, {"googleSearch": {}}],
            "toolConfig": {
                "functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["get_weather"]}
            },
        }
    )
    assert request.params["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city.",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": ["string", "null"]}},
                    "required": ["city"],
                },
            },
        }
    ]
    assert request.params["tool_choice"] == {
        "type": "function",
        "function": {"name": "get_weather"},
    }
    assert request.dropped == ("tools.googleSearch",)
    for mode, choice in (("AUTO", "auto"), ("NONE", "none"), ("ANY", "required")):
        config = {"functionCallingConfig": {"mode": mode}}
        body = {"contents": [user("Hi")], "tools": [WEATHER], "toolConfig": config}
        assert chat(body).params["tool_choice"] == choice


SCHEMA_TYPES = st.sampled_from(["OBJECT", "STRING", "INTEGER", "NUMBER", "BOOLEAN", "ARRAY"])
GEMINI_SCHEMA = st.recursive(
    st.fixed_dictionaries({"type": SCHEMA_TYPES}, optional={"nullable": st.booleans()}),
    lambda inner: (
        st.fixed_dictionaries(
            {
                "type": st.just("OBJECT"),
                "properties": st.dictionaries(st.sampled_from("abc"), inner),
            },
            optional={"propertyOrdering": st.just(["a"]), "required": st.just(["a"])},
        )
        | st.fixed_dictionaries({"type": st.just("ARRAY"), "items": inner})
    ),
    max_leaves=8,
)


def _walk(schema: Any) -> Any:
    yield schema
    for value in (schema.get("properties") or {}).values():
        yield from _walk(value)
    if "items" in schema:
        yield from _walk(schema["items"])


@settings(max_examples=examples(200))
@given(schema=GEMINI_SCHEMA)
def test_a_gemini_schema_is_json_schema_upstream(schema):
    """Every type is lower case, `nullable` is a null type, `propertyOrdering` is gone, and the
    shape (properties, items, required) is kept."""
    converted = gemini_tools.json_schema(schema, "parameters")
    for original, node in zip(_walk(schema), _walk(converted), strict=True):
        kind = original["type"].lower()
        assert node["type"] == ([kind, "null"] if original.get("nullable") else kind)
        assert "nullable" not in node and "propertyOrdering" not in node
        assert node.get("required") == original.get("required")


def test_response_schemas_become_a_response_format():
    """responseMimeType JSON with responseSchema (Gemini's) or responseJsonSchema (JSON Schema,
    even with Gemini's upper-case types, as Gemini CLI sends it): a json_schema format."""
    for key in ("responseSchema", "responseJsonSchema"):
        config = {"responseMimeType": "application/json", key: {"type": "OBJECT"}}
        request = chat({"contents": [user("Hi")], "generationConfig": config})
        assert request.params["response_format"] == {
            "type": "json_schema",
            "json_schema": {"name": "response", "schema": {"type": "object"}},
        }
    plain = chat(
        {"contents": [user("Hi")], "generationConfig": {"responseSchema": {"type": "OBJECT"}}}
    )
    assert "response_format" not in plain.params
    assert plain.dropped == ("generationConfig.responseSchema",)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"contents": []}, "contents"),
        ({"contents": [{"role": "system", "parts": [{"text": "x"}]}]}, "contents[0].role"),
        ({"contents": [{"parts": "x"}]}, "contents[0].parts"),
        ({"contents": [{"parts": [{"unknown": 1}]}]}, "contents"),
        (
            {
                "contents": [
                    {"parts": [{"inlineData": {"mimeType": "application/pdf", "data": ""}}]}
                ]
            },
            "contents[0].parts[0].inlineData.mimeType",
        ),
        (
            {
                "contents": [
                    {"parts": [{"fileData": {"mimeType": "image/png", "fileUri": "files/x"}}]}
                ]
            },
            "contents[0].parts[0].fileData.fileUri",
        ),
        ({"contents": [user("x")], "cachedContent": "cachedContents/1"}, "cachedContent"),
        (
            {"contents": [user("x")], "generationConfig": {"temperature": "hot"}},
            "generationConfig.temperature",
        ),
        (
            {"contents": [user("x")], "generationConfig": {"maxOutputTokens": 0}},
            "generationConfig.maxOutputTokens",
        ),
        (
            {"contents": [user("x")], "generationConfig": {"maxOutputTokens": 10**12}},
            "generationConfig.maxOutputTokens",
        ),
        (
            {"contents": [{"role": "model", "parts": [{"functionCall": {"args": {}}}]}]},
            "contents[0].parts[0].functionCall.name",
        ),
        (
            {"contents": [user("x")], "tools": [{"functionDeclarations": [{}]}]},
            "tools[0].functionDeclarations[0].name",
        ),
    ],
)
def test_what_can_not_be_carried_is_refused_naming_the_field(body, param):
    """A request that would change without what lanes can not send is a BadField naming the field,
    its message starting with it."""
    with pytest.raises(BadField) as refused:
        chat(body)
    assert refused.value.param == param
    assert str(refused.value).startswith(param)


# -- answers ---------------------------------------------------------------------------------------


def test_an_answer_is_one_candidate_with_usage():
    """Text, the finish reason and usageMetadata (thoughts apart from the candidates' tokens); the
    modelVersion is the model asked for."""
    body = completion({"messages": [{"role": "user", "content": "Hi"}]}, "Hello there.", "m")
    body["usage"]["completion_tokens_details"] = {"reasoning_tokens": 1}
    said = gemini_reply.response_of(body, model="gemini-2.5-flash", response_id="r1")
    [candidate] = said["candidates"]
    assert candidate["content"] == {"parts": [{"text": "Hello there."}], "role": "model"}
    assert candidate["finishReason"] == "STOP"
    usage = said["usageMetadata"]
    prompt, completed = body["usage"]["prompt_tokens"], body["usage"]["completion_tokens"]
    assert usage == {
        "promptTokenCount": prompt,
        "candidatesTokenCount": completed - 1,
        "thoughtsTokenCount": 1,
        "totalTokenCount": prompt + completed,
    }
    assert said["modelVersion"] == "gemini-2.5-flash" and said["responseId"] == "r1"


@pytest.mark.parametrize(
    ("reason", "finish"),
    [
        ("stop", "STOP"),
        ("length", "MAX_TOKENS"),
        ("tool_calls", "STOP"),
        ("content_filter", "SAFETY"),
        ("odd", "OTHER"),
    ],
)
def test_finish_reasons_are_gemini_s(reason, finish):
    """Each chat finish reason as Gemini says it."""
    body = {"choices": [{"message": {"content": "x"}, "finish_reason": reason}]}
    said = gemini_reply.response_of(body, model="m", response_id="r")
    assert said["candidates"][0]["finishReason"] == finish


def test_a_tool_call_is_a_function_call_with_its_id():
    """A tool call is a functionCall with its id and its arguments as an object; one without an id
    gets one."""
    request = {
        "messages": [{"role": "user", "content": "Weather?"}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}],
    }
    body = completion(request, "unused", "m")
    body["choices"][0]["message"]["tool_calls"].append(
        {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    )
    parts = gemini_reply.response_of(body, model="m", response_id="r")["candidates"][0]["content"][
        "parts"
    ]
    first, second = (part["functionCall"] for part in parts)
    assert first["id"] == body["choices"][0]["message"]["tool_calls"][0]["id"]
    assert second == {"id": "call_r_1", "name": "get_weather", "args": {"city": "Oslo"}}


@settings(max_examples=examples(200))
@given(text=TEXT, cuts=st.lists(st.integers(0, 60), max_size=6), thoughts=st.booleans())
def test_a_stream_says_what_the_whole_answer_says(text, cuts, thoughts):
    """The streamed responses' text adds up to the answer's, a tool call's arguments cut anywhere
    arrive as one whole functionCall, and only the last response has the finish reason and usage."""
    request = {"messages": [{"role": "user", "content": "Hi"}]}
    stream = gemini_reply.ResponseChunks(model="m", response_id="r", thoughts=thoughts)
    said = [r for chunk in chunks(request, text, "m") for r in stream.feed(chunk)]
    arguments = json.dumps({"city": text})
    bounds = sorted({min(c, len(arguments)) for c in cuts} | {0, len(arguments)})
    for k, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)):
        call = {"index": 0, "function": {"arguments": arguments[a:b]}}
        if k == 0:
            call |= {"id": "c1", "function": {"name": "f", "arguments": arguments[a:b]}}
        said += stream.feed({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})
    said += stream.finish(usage={"prompt_tokens": 3, "completion_tokens": 4})
    parts = [p for r in said for p in r["candidates"][0]["content"]["parts"]]
    assert "".join(p.get("text", "") for p in parts) == text
    assert [p["functionCall"] for p in parts if "functionCall" in p] == [
        {"id": "c1", "name": "f", "args": {"city": text}}
    ]
    assert [("finishReason" in r["candidates"][0], "usageMetadata" in r) for r in said] == [
        (False, False)
    ] * (len(said) - 1) + [(True, True)]


def test_errors_are_google_s_shape_with_a_retryable_status():
    """code, message, status (RESOURCE_EXHAUSTED, UNAVAILABLE … tell a client to retry), the bad
    field as a field violation, the wait as RetryInfo."""
    said = gemini_reply.error_of(
        429, "free capacity is gone", reason="free_tier_exhausted", retry_after_s=7
    )
    assert said["error"]["code"] == 429 and said["error"]["status"] == "RESOURCE_EXHAUSTED"
    assert {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "7s"} in said[
        "error"
    ]["details"]
    bad = gemini_reply.error_of(400, "contents: must be a non-empty array", field="contents")
    assert bad["error"]["status"] == "INVALID_ARGUMENT"
    assert bad["error"]["details"][0]["fieldViolations"][0]["field"] == "contents"
    statuses = {s: gemini_reply.error_of(s, "x")["error"]["status"] for s in (502, 503, 504, 500)}
    assert statuses == {
        502: "UNAVAILABLE",
        503: "UNAVAILABLE",
        504: "DEADLINE_EXCEEDED",
        500: "INTERNAL",
    }


def test_a_function_calls_thought_signature_goes_both_ways():
    """A chat tool call's thought signature (Gemini 3's, which it needs back) is its functionCall
    part's thoughtSignature, whole and streamed; sent back on the part — as it was given (Gemini
    CLI), URL-safe (google-genai), unpadded, in snake_case — it is the call's extra content again,
    in the standard base64 Gemini gave; one that is not base64 goes as it came."""
    signature = base64.b64encode(bytes(range(240, 256)) * 3).decode()  # `+`, `/`, `=`
    extra = {"google": {"thought_signature": signature}}
    function = {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    call = {"id": "fc-1", "type": "function", "function": function, "extra_content": extra}
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    whole = {"choices": [{"message": message, "finish_reason": "tool_calls"}]}
    [part] = gemini_reply.response_of(whole, model="m", response_id="r")["candidates"][0][
        "content"
    ]["parts"]
    stream = gemini_reply.ResponseChunks(model="m", response_id="r")
    said = stream.feed({"choices": [{"index": 0, "delta": message}]}) + stream.finish()
    [streamed] = [p for r in said for p in r["candidates"][0]["content"]["parts"]]
    asked = {"id": "fc-1", "name": "get_weather", "args": {"city": "Oslo"}}
    assert part == streamed == {"functionCall": asked, "thoughtSignature": signature}
    url_safe = signature.replace("+", "-").replace("/", "_")
    sent_back = [
        {"thoughtSignature": signature},
        {"thoughtSignature": url_safe},
        {"thoughtSignature": url_safe.rstrip("=")},
        {"thought_signature": signature},
        {"thoughtSignature": "not base64!"},
    ]
    for sent in sent_back:
        model_turn = {"role": "model", "parts": [{"functionCall": asked, **sent}]}
        request = chat({"contents": [user("Weather?"), model_turn], "tools": [WEATHER]})
        [back] = request.messages[1]["tool_calls"]
        expected = "not base64!" if "not base64!" in sent.values() else signature
        assert back["extra_content"] == {"google": {"thought_signature": expected}}
        assert request.dropped == ()

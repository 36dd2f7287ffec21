"""What real providers send, relayed exactly: typed content parts and reasoning in answers and
streams, usage wherever it is put (counted once), errors inside a 200 — kept with the
provider's own status, recorded as failed attempts, never `ok` — and tool calls streamed without
an index (Gemini) reaching every door as the calls they are."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from typing import Any

import anthropic
import httpx2
import openai
import pytest
import trio
from google import genai
from google.genai import types

import lanes
from helpers import config, free_lane
from lanes.testing import open_fake, raw, replay
from sidecar import open_sidecar

MESSAGES: list[Any] = [{"role": "user", "content": "What is 2+2?"}]
SSE = {"content-type": "text/event-stream"}
JSON = {"content-type": "application/json"}


def events(*chunks: dict[str, Any] | str, event: str | None = None) -> list[bytes]:
    out = []
    for chunk in chunks:
        data = chunk if isinstance(chunk, str) else json.dumps(chunk)
        out.append(f"data: {data}\n\n".encode())
    return out


def chunk(
    delta: dict[str, Any] | None = None, finish: str | None = None, **top: Any
) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {"id": "c1", "object": "chat.completion.chunk", "model": "m", "choices": choices, **top}


THINK = [{"type": "thinking", "thinking": [{"type": "text", "text": "Basic arithmetic."}]}]
TYPED = [
    chunk({"role": "assistant", "content": THINK}),
    chunk({"content": [{"type": "text", "text": "2 + 2 = 4"}]}),
    chunk({"content": ""}, "stop", usage={"prompt_tokens": 10, "completion_tokens": 46}),
]
TYPED_JSON = {
    "id": "a4e2",
    "object": "chat.completion",
    "model": "m",
    "choices": [
        {
            "index": 0,
            "finish_reason": "stop",
            "message": {
                "role": "assistant",
                "content": [*THINK, {"type": "text", "text": "2 + 2 = 4"}],
            },
        }
    ],
    "usage": {"prompt_tokens": 10, "completion_tokens": 46, "total_tokens": 56},
}


def client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)


def stream_of(*chunks: dict[str, Any] | str) -> Any:
    return raw(headers=SSE, chunks=lambda: events(*chunks, "[DONE]"))


async def story(url: str, request_id: str) -> dict[str, Any]:
    """The request's story, once its audit row is written (in the background)."""
    async with httpx2.AsyncClient(trust_env=False, timeout=10) as http:
        with trio.fail_after(10):
            found = await http.get(f"{url}/requests/{request_id}")
            while found.status_code != 200:  # the audit row is written in the background
                await trio.sleep(0.05)
                found = await http.get(f"{url}/requests/{request_id}")
    return found.json()


async def chat_stream(url: str, **extra: Any) -> tuple[list[Any], str]:
    """The chunks the OpenAI SDK reads from a stream, and its request id."""
    raw_stream = await client(url).chat.completions.with_raw_response.create(
        model="auto", messages=MESSAGES, stream=True, **extra
    )
    return [c async for c in raw_stream.parse()], raw_stream.headers["x-lanes-request-id"]


async def test_typed_parts_in_a_stream_reach_the_client_as_text_and_reasoning():
    """A stream whose deltas carry typed content parts reaches an OpenAI client as text, its
    thinking as `reasoning_content`; the job's story says `ok` with the provider's tokens."""
    async with open_sidecar(("local", "local", ["local-model"])) as (url, fakes):
        fakes["local"].script("local-model", stream_of(*TYPED))
        chunks, request_id = await chat_stream(url)
        told = await story(url, request_id)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == "2 + 2 = 4"
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == (
        "Basic arithmetic."
    )
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert told["outcome"] == "ok" and told["attempt_list"][0]["tokens"] == 56


async def test_typed_parts_in_an_answer_are_read_as_the_stream_is():
    """The same parts in a whole answer: the client gets the same text and reasoning (the answer
    is encoded again, as its bytes could not be passed on)."""
    async with open_sidecar(("local", "local", ["local-model"])) as (url, fakes):
        fakes["local"].script("local-model", raw(200, json.dumps(TYPED_JSON).encode()))
        completion = await client(url).chat.completions.create(model="auto", messages=MESSAGES)
    message = completion.choices[0].message
    assert message.content == "2 + 2 = 4"
    assert message.reasoning_content == "Basic arithmetic."  # type: ignore[attr-defined]
    assert completion.usage is not None and completion.usage.total_tokens == 56


@pytest.mark.free_lane
async def test_usage_in_a_vendor_extension_counts_toward_the_free_tier(env):
    """A stream that reports its usage only inside `x_<vendor>.usage` (no `stream_options`) still
    counts its tokens: against the lane's per-minute tokens and in the job's attempt."""
    usage = {"prompt_tokens": 45, "completion_tokens": 662, "total_tokens": 707}
    chunks = events(
        chunk({"role": "assistant", "content": ""}, x_vendor={"id": "req_1"}),
        chunk({"content": "Hi."}),
        chunk({}, "stop", x_vendor={"id": "req_1", "usage": usage}),
        "[DONE]",
    )
    async with open_fake("free", models=("free-model",)) as free:
        free.script("free-model", raw(headers=SSE, chunks=lambda: chunks))
        cfg = config(free_lane("free", free.base_url))
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
            async with dispatcher.open_stream(lanes.Job(messages=MESSAGES)) as stream:
                assert "".join(
                    [c["choices"][0]["delta"].get("content") or "" async for c in stream]
                )
            manager = dispatcher.manager
            used = manager.used(
                manager.scope("free", "free-model"), "tokens", "minute", dispatcher.now_wall()
            )
            attempt = stream.attempts[-1]
    assert "stream_options" not in free.requests()[0].body  # a free stream is not asked for usage
    assert (used, attempt.outcome, attempt.tokens) == (707, "ok", 707)


async def test_usage_repeated_on_every_chunk_is_counted_once():
    """A provider that sends its running usage on every chunk (here inside its extension object)
    is billed the last figure, once: the paid settlement is that figure at the model's prices —
    never the sum of the chunks, nor the reservation."""

    def running(delta: dict[str, Any], finish: str | None, completion: int) -> dict[str, Any]:
        usage = {"prompt_tokens": 100, "completion_tokens": completion}
        return chunk(delta, finish, x_vendor={"usage": usage})

    running_chunks = [
        running({"role": "assistant", "content": "a"}, None, 1),
        running({"content": "b"}, None, 2),
        running({}, "stop", 3),
    ]
    async with open_sidecar(("paid", "paid", ["paid-model"])) as (url, fakes):
        fakes["paid"].script("paid-model", stream_of(*running_chunks))
        chunks, request_id = await chat_stream(url)
        told = await story(url, request_id)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "ab"
    # 1 USD per million input tokens, 2 per million output (lanes.harness.configs)
    assert told["attempt_list"][0]["tokens"] == 103
    assert told["cost_usd"] == pytest.approx((100 * 1.0 + 3 * 2.0) / 1e6, rel=1e-9)


RATE_LIMITED_MID_STREAM = chunk(
    {"content": ""},
    "error",
    provider="OpenAI",
    error={
        "code": 429,
        "message": "Rate limit exceeded",
        "metadata": {"error_type": "rate_limit_exceeded"},
    },
)


@pytest.mark.free_lane
async def test_a_rate_limit_inside_a_stream_is_a_rate_limit_not_a_success():
    """A 429 the provider sends mid-stream (a chunk with an `error` and finish reason `error`)
    reaches the client as an in-band rate-limit error with the provider's code; the attempt is
    recorded `rate_limited` — not `ok`, not a fault (the breaker stays closed) — and the lane is
    backed off."""
    async with open_sidecar(("free", "free", ["free-model"])) as (url, fakes):
        fakes["free"].script(
            "free-model",
            stream_of(chunk({"role": "assistant", "content": "Hel"}), RATE_LIMITED_MID_STREAM),
        )
        raw_stream = await client(url).chat.completions.with_raw_response.create(
            model="auto", messages=MESSAGES, stream=True
        )
        got = []
        with pytest.raises(openai.APIError) as caught:
            async for c in raw_stream.parse():
                got.append(c)
        told = await story(url, raw_stream.headers["x-lanes-request-id"])
        async with httpx2.AsyncClient(trust_env=False) as http:
            state = (await http.get(f"{url}/lanes")).json()
            metrics = (await http.get(f"{url[:-3]}/metrics")).text
    assert [c.choices[0].delta.content for c in got] == ["Hel"]
    assert caught.value.code == "rate_limit_exceeded" and caught.value.type == "rate_limit_error"
    attempt = told["attempt_list"][0]
    assert told["outcome"] == "rate_limited" and attempt["outcome"] == "rate_limited"
    assert attempt["status"] == 200 and attempt["tokens"] == 0
    model = state["lanes"][0]["models"][0]
    assert model["breaker"]["state"] == "closed" and model["backoff_reason"] == "rate_limited"
    assert (
        'outcome="rate_limited"' in metrics
        and 'lane="free",model="free-model",outcome="ok"' not in metrics
    )


GROQ_TOOL_ERROR = (
    '{"error":{"message":"Tool call validation failed: parameters did not match schema",'
    '"type":"invalid_request_error","code":"tool_use_failed","status_code":400}}'
)


async def test_a_400_inside_a_stream_is_final_and_keeps_its_status():
    """An `event: error` whose data says `status_code: 400` after chunks were delivered ends the
    stream with an in-band 400 (`invalid_request_error`, the provider's code) and is not tried
    on another lane: the request is at fault, wherever it went."""
    body = lambda: [  # noqa: E731
        *events(chunk({"role": "assistant", "reasoning": "We need to call"})),
        f"event: error\ndata: {GROQ_TOOL_ERROR}\n\n".encode(),
    ]
    async with open_sidecar(
        ("local", "local", ["local-model"]), ("paid", "paid", ["paid-model"])
    ) as (url, fakes):
        fakes["local"].script("local-model", raw(headers=SSE, chunks=body))
        raw_stream = await client(url).chat.completions.with_raw_response.create(
            model="auto", messages=MESSAGES, stream=True
        )
        with pytest.raises(openai.APIError) as caught:
            async for _ in raw_stream.parse():
                pass
        told = await story(url, raw_stream.headers["x-lanes-request-id"])
    assert caught.value.code == "tool_use_failed" and caught.value.type == "invalid_request_error"
    assert fakes["paid"].requests() == []
    assert [a["outcome"] for a in told["attempt_list"]] == ["final"]


@pytest.mark.parametrize(
    ("said", "status", "served_by"),
    [
        (RATE_LIMITED_MID_STREAM, 200, "paid"),  # a rate limit: the next lane serves
        (json.loads(GROQ_TOOL_ERROR), 400, None),  # final: a real HTTP 400, nothing else tried
    ],
)
async def test_an_error_before_any_chunk_is_an_http_answer(said, status, served_by):
    """An error the provider sends as the first event of its stream is handled before the client
    gets a byte: a rate limit falls back to the next lane; a 400 is the HTTP status the client
    gets, with the provider's code."""
    async with open_sidecar(
        ("local", "local", ["local-model"]), ("paid", "paid", ["paid-model"])
    ) as (url, fakes):
        fakes["local"].script("local-model", stream_of(said))
        async with httpx2.AsyncClient(trust_env=False, timeout=30) as http:
            response = await http.post(
                f"{url}/chat/completions", json={"messages": MESSAGES, "stream": True}
            )
    assert response.status_code == status
    if served_by:
        assert response.headers["x-lanes-lane"] == served_by and "data: [DONE]" in response.text
    else:
        assert response.json()["error"]["code"] == "tool_use_failed"
        assert fakes["paid"].requests() == []


async def test_an_error_body_inside_a_200_keeps_its_status():
    """A 200 JSON answer that is an error with a 429 in it is a rate limit (another lane serves,
    the attempt is `rate_limited`), not garbage."""
    limited = {"error": {"code": 429, "message": "Rate limit exceeded"}}
    async with open_sidecar(
        ("local", "local", ["local-model"]), ("other", "local", ["other-model"])
    ) as (url, fakes):
        fakes["local"].script("local-model", raw(200, json.dumps(limited).encode()))
        raw_answer = await client(url).chat.completions.with_raw_response.create(
            model="auto", messages=MESSAGES
        )
        told = await story(url, raw_answer.headers["x-lanes-request-id"])
    assert raw_answer.headers["x-lanes-lane"] == "other"
    assert [a["outcome"] for a in told["attempt_list"]] == ["rate_limited", "ok"]


REASONING = [
    chunk({"role": "assistant", "content": None, "reasoning_content": "We need"}),
    chunk({"content": None, "reasoning_content": " to add."}),
    chunk({"content": "4", "reasoning_content": None}),
    chunk({"content": ""}, "stop", usage={"prompt_tokens": 18, "completion_tokens": 9}),
]


async def test_reasoning_reaches_a_messages_client_as_thinking_blocks():
    """On the Messages door the provider's reasoning is a `thinking` block before the text, in a
    stream (thinking_delta, then a signature_delta) and in a whole message alike."""
    async with open_sidecar(("local", "local", ["local-model"])) as (url, fakes):
        fakes["local"].script("local-model", stream_of(*REASONING))
        claude = anthropic.AsyncAnthropic(base_url=url[:-3], api_key="unused", max_retries=0)
        async with claude.messages.stream(model="auto", max_tokens=64, messages=MESSAGES) as stream:
            kinds = [e.type async for e in stream]
            streamed = await stream.get_final_message()
        fakes["local"].script("local-model", raw(200, json.dumps(TYPED_JSON).encode()))
        whole = await claude.messages.create(model="auto", max_tokens=64, messages=MESSAGES)
    assert [b.type for b in streamed.content] == ["thinking", "text"]
    assert streamed.content[0].thinking == "We need to add."  # type: ignore[union-attr]
    assert streamed.content[1].text == "4"  # type: ignore[union-attr]
    assert "signature" in kinds and streamed.usage.output_tokens == 9
    assert [b.type for b in whole.content] == ["thinking", "text"]
    assert whole.content[0].thinking == "Basic arithmetic."  # type: ignore[union-attr]


async def test_reasoning_reaches_a_responses_client_as_a_reasoning_item():
    """On the Responses door the provider's reasoning is a reasoning item (its text as
    `reasoning_text`) before the message, streamed (`response.reasoning_text.delta`) and whole."""
    async with open_sidecar(("local", "local", ["local-model"])) as (url, fakes):
        fakes["local"].script("local-model", stream_of(*REASONING))
        async with client(url).responses.stream(model="auto", input="What is 2+2?") as stream:
            kinds = [e.type async for e in stream]
            streamed = await stream.get_final_response()
        fakes["local"].script("local-model", raw(200, json.dumps(TYPED_JSON).encode()))
        whole = await client(url).responses.create(model="auto", input="What is 2+2?")
    assert [i.type for i in streamed.output] == ["reasoning", "message"]
    assert streamed.output[0].content[0].text == "We need to add."  # type: ignore[union-attr,index]
    assert streamed.output_text == "4" and "response.reasoning_text.delta" in kinds
    assert [i.type for i in whole.output] == ["reasoning", "message"]
    assert whole.output_text == "2 + 2 = 4"


async def test_a_typed_stream_cut_mid_answer_resumes_from_the_text_delivered():
    """Recovery reads the text delivered so far from typed parts too: a typed stream cut after
    "The quick " resumes on a prefill-capable candidate with exactly that text as the trailing
    assistant message, and the client gets one unbroken answer."""
    typed = [
        chunk({"role": "assistant", "content": [{"type": "text", "text": "The quick "}]}),
        chunk({"content": [*THINK, {"type": "text", "text": ""}]}),
    ]
    prefill = {
        "models": [
            {
                "id": "paid-model",
                "input_usd_per_mtok": 1.0,
                "output_usd_per_mtok": 2.0,
                "prefill": True,
            }
        ]
    }
    async with open_sidecar(
        ("local", "local", ["local-model"]), ("paid", "paid", ["paid-model"], prefill)
    ) as (url, fakes):
        fakes["local"].script("local-model", raw(headers=SSE, chunks=lambda: events(*typed)))
        chunks, _ = await chat_stream(url)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "The quick brown fox jumps over the lazy dog."
    resumed = fakes["paid"].requests()[0].body["messages"][-1]
    assert resumed == {"role": "assistant", "content": "The quick "}


# == tool calls streamed the way Gemini streams them =========================================

GEMINI_LANE = ("gemini", "local", ["corpus-model"], {"module": "gemini"})
TO_READ: list[Any] = [{"role": "user", "content": "read both files"}]


def _sse(*chunks: dict[str, Any]) -> bytes:
    body = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    return b"HTTP/1.1 200 OK\ncontent-type: text/event-stream\n\n" + body + b"data: [DONE]\n\n"


def _chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return {"object": "chat.completion.chunk", "model": "gemini-x", "choices": [choice], **extra}


def _call(call_id: str, path: str, **extra: Any) -> dict[str, Any]:
    arguments = json.dumps({"path": path})
    function = {"name": "read", "arguments": arguments}
    return {"id": call_id, "type": "function", "function": function, **extra}


#: Gemini's OpenAI-compatible endpoint streams each tool call whole, in a chunk of its own, with
#: no `index` (the shape quoted in THU-MAIC/OpenMAIC#1556, open-webui/computer#224,
#: meilisearch/meilisearch#5712): the OpenAI contract requires one.
GEMINI_TWO_CALLS = _sse(
    _chunk(
        {
            "role": "assistant",
            "tool_calls": [_call("function-call-1", "a.txt", extra_content={"google": {}})],
        }
    ),
    _chunk({"tool_calls": [_call("function-call-2", "b.txt")]}),
    _chunk(
        {}, "tool_calls", usage={"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}
    ),
)


READS = [("read", '{"path": "a.txt"}'), ("read", '{"path": "b.txt"}')]


async def test_indexless_streamed_tool_calls_stay_two_calls_on_the_responses_api():
    """Two tool calls a provider streams without `index` (Gemini) reach a Responses client as
    two function_call items with valid JSON arguments, not one call whose arguments are both
    objects glued together."""
    async with open_sidecar(GEMINI_LANE) as (url, fakes):
        fakes["gemini"].script("corpus-model", replay(GEMINI_TWO_CALLS))
        async with client(url).responses.stream(model="auto", input="read both files") as stream:
            response = await stream.get_final_response()
    calls = [(i.name, i.arguments) for i in response.output if i.type == "function_call"]
    assert calls == READS


async def test_indexless_streamed_tool_calls_stay_two_tool_use_blocks_on_the_messages_api():
    """The same stream reaches a Messages client (Claude Code) as two tool_use blocks."""
    async with open_sidecar(GEMINI_LANE) as (url, fakes):
        fakes["gemini"].script("corpus-model", replay(GEMINI_TWO_CALLS))
        claude = anthropic.AsyncAnthropic(base_url=url[:-3], api_key="unused", max_retries=0)
        async with claude.messages.stream(model="auto", max_tokens=64, messages=TO_READ) as stream:
            message = await stream.get_final_message()
    uses = [(b.name, b.input) for b in message.content if b.type == "tool_use"]
    assert uses == [("read", {"path": "a.txt"}), ("read", {"path": "b.txt"})]
    assert message.stop_reason == "tool_use"


async def test_indexless_streamed_tool_calls_reach_chat_clients_with_an_index():
    """On chat completions each streamed tool-call delta carries the `index` the OpenAI contract
    requires, so the OpenAI SDK's stream helper (and the AI SDK's chunk schema) can read it: one
    index per call id, in order."""
    async with open_sidecar(GEMINI_LANE) as (url, fakes):
        fakes["gemini"].script("corpus-model", replay(GEMINI_TWO_CALLS))
        async with client(url).chat.completions.stream(model="auto", messages=TO_READ) as stream:
            final = await stream.get_final_completion()
    calls = final.choices[0].message.tool_calls or []
    assert [(c.function.name, c.function.arguments) for c in calls] == READS


#: Gemini also ends a streamed tool-call answer with `finish_reason: "stop"`
#: (open-webui/computer#224).
GEMINI_STOP = _sse(
    _chunk({"role": "assistant", "tool_calls": [_call("function-call-1", "a.txt")]}),
    _chunk({}, "stop"),
)


async def test_a_tool_call_answer_that_says_stop_is_tool_use_on_the_messages_api():
    """A streamed answer holding a tool call whose finish reason says `stop` (Gemini) is
    `stop_reason: tool_use` on the Messages API: the client runs the tool instead of ending the
    turn."""
    async with open_sidecar(GEMINI_LANE) as (url, fakes):
        fakes["gemini"].script("corpus-model", replay(GEMINI_STOP))
        claude = anthropic.AsyncAnthropic(base_url=url[:-3], api_key="unused", max_retries=0)
        async with claude.messages.stream(model="auto", max_tokens=64, messages=TO_READ) as stream:
            message = await stream.get_final_message()
    assert [b.type for b in message.content] == ["tool_use"]
    assert message.stop_reason == "tool_use"


#: Gemini 3 signs each tool call (`extra_content.google.thought_signature`) and refuses the next
#: request when the signature is not sent back on that call (its thought-signatures
#: documentation; THU-MAIC/OpenMAIC#1556). Chat clients keep and resend it; a Messages or a
#: Responses client can only send back the id lanes gave it, and a Gemini API client sends it as
#: the part's `thoughtSignature`. A signature of a few KB, in standard base64 (`+`, `/`, `=`).
SIGNATURE = base64.b64encode(hashlib.shake_256(b"lanes").digest(2045)).decode()
SIGNED_CALL = _call(
    "function-call-1", "a.txt", extra_content={"google": {"thought_signature": SIGNATURE}}
)
GEMINI_SIGNED = _sse(
    _chunk({"role": "assistant", "tool_calls": [SIGNED_CALL]}), _chunk({}, "tool_calls")
)
GEMINI_SIGNED_WHOLE = (
    b"HTTP/1.1 200 OK\ncontent-type: application/json\n\n"
    + json.dumps(
        {
            "object": "chat.completion",
            "model": "gemini-x",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": None, "tool_calls": [SIGNED_CALL]},
                    "finish_reason": "tool_calls",
                }
            ],
            "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12},
        }
    ).encode()
)
SIGNED = {True: GEMINI_SIGNED, False: GEMINI_SIGNED_WHOLE}


DONE = (
    b"HTTP/1.1 200 OK\ncontent-type: application/json\n\n"
    b'{"id":"x","object":"chat.completion","created":1,"model":"gemini-x","choices":[{"index":0,'
    b'"message":{"role":"assistant","content":"done"},"finish_reason":"stop"}],'
    b'"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}'
)


def sent_back(fakes: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The tool call the second request sent upstream, and the ids its tool messages answer."""
    sent = fakes["gemini"].requests()[-1].body["messages"]
    [call] = [c for m in sent for c in m.get("tool_calls") or ()]
    return call, [m["tool_call_id"] for m in sent if m["role"] == "tool"]


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "whole"])
async def test_a_tool_calls_thought_signature_goes_back_upstream_from_the_messages_api(streamed):
    """A Messages client (Claude Code) that sends back the tool_use it got from Gemini, with its
    tool_result, makes lanes send that call upstream with the id and the signature Gemini gave
    it — the tool_use id it was given being one the Messages API accepts."""
    async with open_sidecar(GEMINI_LANE) as (url, fakes):
        fakes["gemini"].script("corpus-model", replay(SIGNED[streamed]), replay(DONE))
        claude = anthropic.AsyncAnthropic(base_url=url[:-3], api_key="unused", max_retries=0)
        tools: Any = [{"name": "read", "input_schema": {"type": "object"}}]
        asked: Any = {"model": "auto", "max_tokens": 64, "tools": tools}
        if streamed:
            async with claude.messages.stream(**asked, messages=TO_READ) as stream:
                first = await stream.get_final_message()
        else:
            first = await claude.messages.create(**asked, messages=TO_READ)
        [use] = [b for b in first.content if b.type == "tool_use"]
        result = {"type": "tool_result", "tool_use_id": use.id, "content": "hello"}
        turn: Any = [
            *TO_READ,
            {"role": "assistant", "content": [use.model_dump(exclude_none=True)]},
            {"role": "user", "content": [result]},
        ]
        await claude.messages.create(**asked, messages=turn)
    assert re.fullmatch(r"[a-zA-Z0-9_-]+", use.id) and use.input == {"path": "a.txt"}
    assert sent_back(fakes) == (SIGNED_CALL, ["function-call-1"])


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "whole"])
async def test_a_tool_calls_thought_signature_goes_back_upstream_from_the_responses_api(streamed):
    """A Responses client (Codex) that sends back the function_call item it got from Gemini, with
    its output, makes lanes send that call upstream with the id and the signature Gemini gave
    it."""
    async with open_sidecar(GEMINI_LANE) as (url, fakes):
        fakes["gemini"].script("corpus-model", replay(SIGNED[streamed]), replay(DONE))
        tools: Any = [{"type": "function", "name": "read", "parameters": {"type": "object"}}]
        first: Any
        if streamed:
            async with client(url).responses.stream(
                model="auto", input="read a.txt", tools=tools
            ) as stream:
                first = await stream.get_final_response()
        else:
            first = await client(url).responses.create(
                model="auto", input="read a.txt", tools=tools
            )
        [call] = [i for i in first.output if i.type == "function_call"]
        turn: Any = [
            {"role": "user", "content": "read a.txt"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": "read",
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "hello"},
        ]
        await client(url).responses.create(model="auto", input=turn, tools=tools)
    assert sent_back(fakes) == (SIGNED_CALL, ["function-call-1"])


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "whole"])
async def test_a_tool_calls_thought_signature_goes_back_upstream_from_the_gemini_api(streamed):
    """A Gemini API client (google-genai) gets Gemini's signature as the functionCall part's
    thoughtSignature, and sending that part back makes lanes send the call upstream with the
    signature exactly as Gemini gave it (the SDK sends the bytes back URL-safe)."""
    async with open_sidecar(GEMINI_LANE) as (url, fakes):
        fakes["gemini"].script("corpus-model", replay(SIGNED[streamed]), replay(DONE))
        sdk: Any = genai.Client(
            api_key="unused",
            http_options=types.HttpOptions(
                base_url=url[:-3],
                api_version="v1beta",
                retry_options=types.HttpRetryOptions(attempts=1),
            ),
        )
        read = types.FunctionDeclaration(name="read", parameters_json_schema={"type": "object"})
        config = types.GenerateContentConfig(tools=[types.Tool(function_declarations=[read])])

        def first_turn() -> Any:
            asked: Any = {"model": "auto", "contents": "read a.txt", "config": config}
            if not streamed:
                return sdk.models.generate_content(**asked).candidates[0].content
            pieces = sdk.models.generate_content_stream(**asked)
            parts = [p for piece in pieces for p in piece.candidates[0].content.parts]
            return types.Content(role="model", parts=parts)

        said = await trio.to_thread.run_sync(first_turn)
        [part] = said.parts
        answer: Any = types.Part.from_function_response(name="read", response={"output": "hello"})
        answer.function_response.id = part.function_call.id
        turn = [
            types.Content(role="user", parts=[types.Part(text="read a.txt")]),
            said,
            types.Content(role="user", parts=[answer]),
        ]
        await trio.to_thread.run_sync(
            lambda: sdk.models.generate_content(model="auto", contents=turn, config=config)
        )
    assert part.thought_signature == base64.b64decode(SIGNATURE)
    assert part.function_call.id == "function-call-1"
    call, answered = sent_back(fakes)
    assert call["extra_content"] == SIGNED_CALL["extra_content"]
    assert answered == [call["id"]] == ["function-call-1"]

"""The Responses API, the Messages API, embeddings and models by id, over real loopback sockets,
with the official `openai` and `anthropic` packages as clients — and the same policies as chat:
fallback, mid-stream recovery, deadlines, consent, the ceiling, each API's own error shape."""

from __future__ import annotations

import json
import logging
import sqlite3
from typing import Any

import anthropic
import httpx2
import openai
import pytest

from lanes.testing import ANSWER, answer, hang, rate_limited, status, stream_cut
from sidecar import CLIENT_KEY, open_sidecar

PREFILL = {
    "models": [
        {"id": "paid-model", "input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0, "prefill": True}
    ]
}
WEATHER_TOOL: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
CLAUDE_TOOL: Any = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": WEATHER_TOOL["parameters"],
}
USER: Any = [{"role": "user", "content": "Weather in Paris?"}]
EMBEDDING = {"models": [{"id": "chat"}, {"id": "emb", "embedding": True}]}
PAID_EMBEDDING = {"models": [{"id": "emb", "embedding": True, "input_usd_per_mtok": 10.0}]}


def oai(url: str, **kw: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url, api_key=kw.pop("api_key", "unused"), max_retries=0)


def claude(url: str, **kw: Any) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        base_url=url.removesuffix("/v1"), api_key=kw.pop("api_key", "unused"), max_retries=0, **kw
    )


async def post(
    url: str, path: str, body: Any, headers: dict[str, str] | None = None
) -> httpx2.Response:
    async with httpx2.AsyncClient(trust_env=False) as http:
        return await http.post(f"{url}{path}", json=body, headers=headers or {})


def sse(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of each server-sent event in a body."""
    out = []
    for block in raw.decode().split("\n\n"):
        lines = [line for line in block.splitlines() if not line.startswith(":")]
        name = next((line[7:] for line in lines if line.startswith("event: ")), "")
        data = next((line[6:] for line in lines if line.startswith("data: ")), None)
        if data is not None:
            out.append((name, json.loads(data)))
    return out


# -- the Responses API -----------------------------------------------------------------------------


async def test_responses_create_with_the_openai_sdk():
    """A plain Responses request: the answer as output_text, usage, and who served it in X-Lanes-*;
    upstream it was a chat completion."""
    async with open_sidecar(("local", "local", ["local-model"])) as (url, fakes):
        raw = await oai(url).responses.with_raw_response.create(
            model="auto", input="Say hi", instructions="Be brief", max_output_tokens=100
        )
        response = raw.parse()
    sent = fakes["local"].requests()[0]
    assert response.output_text == ANSWER and response.status == "completed"
    assert response.usage is not None and response.usage.output_tokens == len(ANSWER) // 4
    assert response.id == "resp_" + raw.headers["x-lanes-request-id"]
    assert raw.headers["x-lanes-lane"] == "local" and raw.headers["x-lanes-route"] == "local"
    assert sent.path == "/v1/chat/completions" and sent.body["max_tokens"] == 100
    assert sent.body["messages"][0] == {"role": "system", "content": "Be brief"}


async def test_responses_stream_with_the_openai_sdk():
    """stream=True: the Responses events in order, the deltas adding up to the answer."""
    async with open_sidecar(("local", "local", ["local-model"])) as (url, fakes):
        stream = await oai(url).responses.create(model="auto", input="Say hi", stream=True)
        events: list[Any] = [event async for event in stream]
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed" and "error" not in kinds
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == ANSWER and events[-1].response.output_text == ANSWER
    assert [e.sequence_number for e in events] == list(range(len(events)))


async def test_responses_function_tool_round_trip():
    """A function tool is called; its output goes back; the final answer arrives — streamed too."""
    async with open_sidecar(("local", "local", ["local-model"])) as (url, fakes):
        client = oai(url)
        first = await client.responses.create(model="auto", input=USER, tools=[WEATHER_TOOL])
        [call] = first.output
        assert call.type == "function_call" and call.name == "get_weather"
        assert json.loads(call.arguments) == {"city": "city"}
        follow_up: Any = [
            *USER,
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
        ]
        final = await client.responses.create(model="auto", input=follow_up, tools=[WEATHER_TOOL])
        async with client.responses.stream(
            model="auto", input=USER, tools=[WEATHER_TOOL]
        ) as stream:
            kinds = [event.type async for event in stream]
            streamed = await stream.get_final_response()
    upstream = fakes["local"].requests()[1].body["messages"]
    assert final.output_text == ANSWER
    assert upstream[1]["tool_calls"][0]["id"] == call.call_id
    assert upstream[2] == {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"}
    assert "response.function_call_arguments.delta" in kinds
    assert streamed.output[0].type == "function_call"


async def test_responses_structured_output():
    """text.format json_schema reaches the upstream as response_format; the answer fits it."""
    schema = {
        "type": "object",
        "properties": {"setup": {"type": "string"}, "punchline": {"type": "string"}},
        "required": ["setup", "punchline"],
        "additionalProperties": False,
    }
    async with open_sidecar(("local", "local", ["local-model"])) as (url, fakes):
        response = await oai(url).responses.create(
            model="auto",
            input="A joke",
            text={
                "format": {"type": "json_schema", "name": "joke", "schema": schema, "strict": True}
            },
        )
    assert json.loads(response.output_text) == {"setup": "setup", "punchline": "punchline"}
    assert fakes["local"].requests()[0].body["response_format"]["type"] == "json_schema"


async def test_responses_refuses_what_it_can_not_keep():
    """previous_response_id: 400 naming it; an unknown model: 404 with the job's request id."""
    async with open_sidecar(("local", "local", ["local-model"])) as (url, fakes):
        with pytest.raises(openai.BadRequestError) as refused:
            await oai(url).responses.create(model="auto", input="x", previous_response_id="resp_1")
        unknown = await post(url, "/responses", {"model": "gpt-9", "input": "x"})
    assert refused.value.body["param"] == "previous_response_id"  # type: ignore[index]
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    assert unknown.headers["x-lanes-request-id"]
    assert fakes["local"].requests() == []


# -- the Messages API ------------------------------------------------------------------------------


async def test_messages_create_with_the_anthropic_sdk():
    """A plain Messages request through an alias: text, end_turn, usage, X-Lanes-* headers."""
    async with open_sidecar(
        ("local", "local", ["local-model"]), aliases={"claude-haiku-4-5": ["local/local-model"]}
    ) as (url, fakes):
        raw = await claude(url).messages.with_raw_response.create(
            model="claude-haiku-4-5-20251001",
            max_tokens=100,
            system="Be brief",
            messages=[{"role": "user", "content": "Say hi"}],
            stop_sequences=["END"],
        )
        message = await raw.parse()
    sent = fakes["local"].requests()[0].body
    assert message.content[0].type == "text" and message.content[0].text == ANSWER
    assert message.stop_reason == "end_turn" and message.usage.output_tokens == len(ANSWER) // 4
    assert message.id == "msg_" + raw.headers["x-lanes-request-id"]
    assert raw.headers["x-lanes-lane"] == "local"
    assert sent["stop"] == ["END"] and sent["max_tokens"] == 100
    assert sent["messages"][0] == {"role": "system", "content": "Be brief"}


async def test_messages_stream_with_the_anthropic_sdk():
    """stream=True: the Messages events; the SDK's text stream is the answer."""
    async with (
        open_sidecar(("local", "local", ["local-model"])) as (url, fakes),
        claude(url).messages.stream(
            model="local/local-model", max_tokens=100, messages=[{"role": "user", "content": "Hi"}]
        ) as stream,
    ):
        text = "".join([piece async for piece in stream.text_stream])
        final = await stream.get_final_message()
    assert text == ANSWER and final.stop_reason == "end_turn"


async def test_messages_tool_use_round_trip():
    """A tool_use block with input valid for its schema; the tool_result gets the final answer."""
    async with open_sidecar(("local", "local", ["local-model"])) as (url, fakes):
        client = claude(url)
        first = await client.messages.create(
            model="local-model", max_tokens=200, tools=[CLAUDE_TOOL], messages=USER
        )
        [use] = first.content
        assert (
            use.type == "tool_use" and use.name == "get_weather" and use.input == {"city": "city"}
        )
        assert first.stop_reason == "tool_use"
        final = await client.messages.create(
            model="local-model",
            max_tokens=200,
            tools=[CLAUDE_TOOL],
            messages=[
                *USER,
                {"role": "assistant", "content": [use.model_dump()]},  # type: ignore[misc, list-item]
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}],
                },
            ],
        )
        async with client.messages.stream(
            model="local-model", max_tokens=200, tools=[CLAUDE_TOOL], messages=USER
        ) as stream:
            streamed = await stream.get_final_message()
    assert final.content[0].type == "text" and final.content[0].text == ANSWER
    assert streamed.content[0].type == "tool_use" and streamed.content[0].input == {"city": "city"}
    assert fakes["local"].requests()[1].body["messages"][-1]["role"] == "tool"


async def test_messages_take_the_client_key_in_x_api_key():
    """With client keys configured, x-api-key is the client key; a wrong one is a 401 in the
    Messages API's shape; count_tokens estimates without sending anything."""
    server = {"clients": {"alice": "CLIENT_KEY"}}
    async with open_sidecar(("local", "local", ["local-model"]), server=server) as (url, fakes):
        ok = await claude(url, api_key=CLIENT_KEY).messages.create(
            model="local-model", max_tokens=50, messages=[{"role": "user", "content": "Hi"}]
        )
        with pytest.raises(anthropic.AuthenticationError) as wrong:
            await claude(url, api_key="wrong").messages.create(
                model="local-model", max_tokens=50, messages=[{"role": "user", "content": "Hi"}]
            )
        counted = await claude(url, api_key=CLIENT_KEY).messages.count_tokens(
            model="local-model", messages=[{"role": "user", "content": "Hi"}]
        )
    assert ok.content[0].text == ANSWER  # type: ignore[union-attr]
    assert wrong.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "unknown client key"},
    }
    assert counted.input_tokens > 0 and len(fakes["local"].requests()) == 1


async def test_messages_bad_requests_in_their_own_shape():
    """A missing max_tokens is a 400 invalid_request_error naming it; an unknown model a 404."""
    async with open_sidecar(("local", "local", ["local-model"])) as (url, fakes):
        missing = await post(url, "/messages", {"model": "local-model", "messages": USER})
        unknown = await post(
            url, "/messages", {"model": "claude-9", "max_tokens": 5, "messages": USER}
        )
        not_json = await post(url, "/messages", "[1, 2]")
    assert missing.status_code == 400
    assert missing.json()["error"] == {
        "type": "invalid_request_error",
        "message": "max_tokens: Field required (a positive integer)",
    }
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "not_found_error"
    assert unknown.json()["request_id"] == unknown.headers["x-lanes-request-id"]
    assert not_json.status_code == 400 and not_json.json()["type"] == "error"


# -- the same policies, in each API's words -------------------------------------------------------


async def test_a_cut_stream_is_recovered_in_both_apis():
    """A stream cut after three chunks resumes on a prefill fallback: Responses and Messages
    clients see the whole answer once, and a clean end."""
    async with open_sidecar(
        ("local", "local", ["local-model"]), ("paid", "paid", ["paid-model"], PREFILL)
    ) as (url, fakes):
        fakes["local"].script("local-model", stream_cut(after=3), stream_cut(after=3), answer())
        stream = await oai(url).responses.create(model="auto", input="Hi", stream=True)
        events = [event async for event in stream]
        async with claude(url).messages.stream(
            model="auto", max_tokens=100, messages=[{"role": "user", "content": "Hi"}]
        ) as claude_stream:
            text = "".join([piece async for piece in claude_stream.text_stream])
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == ANSWER
    assert events[-1].type == "response.completed" and events[-1].response.output_text == ANSWER
    assert text == ANSWER
    assert len(fakes["paid"].requests()) == 2  # one resumption for each


async def test_a_broken_stream_ends_in_each_apis_error_event():
    """No honest recovery: Responses ends with `error` and `response.failed` (never completed);
    the Messages API with its `error` event, which its SDK raises."""
    async with open_sidecar(("local", "local", ["local-model"])) as (url, fakes):
        fakes["local"].script("local-model", stream_cut(after=3))
        raw = await post(url, "/responses", {"model": "auto", "input": "Hi", "stream": True})
        with pytest.raises(anthropic.APIStatusError) as broke:
            async with claude(url).messages.stream(
                model="auto", max_tokens=100, messages=[{"role": "user", "content": "Hi"}]
            ) as stream:
                async for _ in stream.text_stream:
                    pass
    names = [name for name, _ in sse(raw.content)]
    assert names[-2:] == ["error", "response.failed"] and "response.completed" not in names
    error = sse(raw.content)[-2][1]
    assert error["code"] == "stream_interrupted" and "stream cut" in error["message"]
    assert broke.value.body["error"]["type"] == "api_error"  # type: ignore[index]
    assert "stream cut" in str(broke.value)


@pytest.mark.free_lane
async def test_free_tier_exhausted_is_each_apis_rate_limit_error():
    """Free capacity gone, fallback off: 429 with Retry-After — OpenAI's shape on /v1/responses,
    rate_limit_error on /v1/messages."""
    async with open_sidecar(
        ("free", "free", ["free-model"]), policy={"free_tier_fallback": "off"}
    ) as (url, fakes):
        fakes["free"].script("free-model", rate_limited(retry_after=7))
        with pytest.raises(openai.RateLimitError) as responses:
            await oai(url).responses.create(model="auto", input="Hi")
        with pytest.raises(anthropic.RateLimitError) as messages:
            await claude(url).messages.create(
                model="auto", max_tokens=10, messages=[{"role": "user", "content": "Hi"}]
            )
    assert responses.value.body["code"] == "free_tier_exhausted"  # type: ignore[index]
    assert responses.value.response.headers["retry-after"] in {"7", "8"}
    assert messages.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    assert messages.value.response.headers["retry-after"] in {"6", "7", "8"}
    assert messages.value.response.headers["x-lanes-next-eligible"] == "free/free-model"


async def test_the_governor_and_the_ceiling_are_429s_in_each_shape():
    """The attempt governor and the paid ceiling answer 429 in each API's own shape."""
    async with open_sidecar(
        ("local", "local", ["local-model"]), policy={"attempts_per_minute": 1}
    ) as (url, fakes):
        await oai(url).responses.create(model="auto", input="Hi")
        governed = await post(url, "/responses", {"model": "auto", "input": "Hi"})
        governed_too = await post(
            url, "/messages", {"model": "auto", "max_tokens": 5, "messages": USER}
        )
    async with open_sidecar(
        ("paid", "paid", ["paid-model"]),
        policy={"free_tier_fallback": "allow", "paid_ceiling_usd_per_day": 0.0},
    ) as (url, fakes):
        broke = await post(url, "/responses", {"model": "auto", "input": "Hi"})
        broke_too = await post(
            url, "/messages", {"model": "auto", "max_tokens": 5, "messages": USER}
        )
    assert governed.status_code == 429 and governed.json()["error"]["code"] == "attempt_governor"
    assert (
        governed_too.status_code == 429
        and governed_too.json()["error"]["type"] == "rate_limit_error"
    )
    assert broke.json()["error"]["code"] == "paid_budget_exhausted"
    assert broke_too.status_code == 429 and broke_too.json()["error"]["type"] == "rate_limit_error"
    assert fakes["paid"].requests() == []


async def test_consent_is_asked_for_in_each_shape():
    """ask with no decision in time: 429 approval_required with the approval's id, in each API."""
    async with open_sidecar(
        ("local", "local", ["local-model"]),
        ("paid", "paid", ["paid-model"]),
        policy={"free_tier_fallback": "ask", "approval_wait_s": 0.2},
    ) as (url, fakes):
        fakes["local"].script("local-model", status(503))
        asked = await post(url, "/responses", {"model": "auto", "input": "Hi"})
        asked_too = await post(
            url, "/messages", {"model": "auto", "max_tokens": 5, "messages": USER}
        )
    assert asked.status_code == 429 and asked.json()["error"]["code"] == "approval_required"
    assert asked.json()["error"]["approval_id"] == asked.headers["x-lanes-approval"]
    assert asked_too.status_code == 429 and asked_too.json()["error"]["type"] == "rate_limit_error"
    assert asked_too.headers["x-lanes-approval"].startswith("ap-")
    assert fakes["paid"].requests() == []


async def test_the_deadline_is_a_504_in_each_shape():
    """A hung upstream past X-Lanes-Deadline-Ms: 504 deadline_exceeded; timeout_error for the
    Messages API."""
    deadline = {"X-Lanes-Deadline-Ms": "500"}
    async with open_sidecar(("local", "local", ["local-model"])) as (url, fakes):
        fakes["local"].script("local-model", hang())
        late = await post(url, "/responses", {"model": "auto", "input": "Hi"}, deadline)
        late_too = await post(
            url, "/messages", {"model": "auto", "max_tokens": 5, "messages": USER}, deadline
        )
    assert late.status_code == 504 and late.json()["error"]["code"] == "deadline_exceeded"
    assert late_too.status_code == 504 and late_too.json()["error"]["type"] == "timeout_error"


async def test_fallback_and_the_audit_hold_for_translated_jobs(tmp_path):
    """A failing primary falls back to paid for a Messages request; the job's audit row names the
    route, by the request id in its headers, and keeps no body."""
    state = tmp_path / "state.db"
    async with open_sidecar(
        ("local", "local", ["local-model"]), ("paid", "paid", ["paid-model"]), state=str(state)
    ) as (url, fakes):
        fakes["local"].script("local-model", status(503))
        raw = await claude(url).messages.with_raw_response.create(
            model="auto", max_tokens=50, messages=[{"role": "user", "content": "Hi"}]
        )
    message = await raw.parse()
    assert raw.headers["x-lanes-route"] == "paid_fallback" and message.content[0].text == ANSWER  # type: ignore[union-attr]
    with sqlite3.connect(state) as db:
        row = db.execute(
            "SELECT outcome, route, lane, body, request_bytes FROM audit WHERE job = ?",
            (raw.headers["x-lanes-request-id"],),
        ).fetchone()
    assert row[:4] == ("ok", "paid_fallback", "paid", "") and row[4] > 0


# -- embeddings and models ------------------------------------------------------------------------


async def test_embeddings_create_with_the_openai_sdk():
    """embeddings.create (the SDK asks for base64 by default) and float: vectors per input, usage,
    X-Lanes-* headers; the upstream got the request untouched."""
    async with open_sidecar(("local", "local", ["chat"], EMBEDDING)) as (url, fakes):
        raw = await oai(url).embeddings.with_raw_response.create(model="emb", input=["a", "b"])
        vectors = raw.parse()
        floats = await post(
            url,
            "/embeddings",
            {"model": "emb", "input": "a", "encoding_format": "float", "dimensions": 4},
        )
    assert len(vectors.data) == 2 and len(vectors.data[0].embedding) == 16
    assert vectors.usage.prompt_tokens > 0 and raw.headers["x-lanes-lane"] == "local"
    assert len(floats.json()["data"][0]["embedding"]) == 4
    sent = fakes["local"].requests()[0]
    assert sent.path == "/v1/embeddings" and sent.body["input"] == ["a", "b"]
    assert sent.body["encoding_format"] == "base64"


async def test_an_embedding_falls_back_only_to_the_same_model():
    """The model on its first lane fails: the same model on another lane serves it — never another
    embedding model, never a chat model; `auto` is refused with the field named."""
    other = {"models": [{"id": "emb", "embedding": True}, {"id": "emb-2", "embedding": True}]}
    async with open_sidecar(
        ("a", "local", ["chat"], EMBEDDING),
        ("b", "local", ["chat"], other),
        ("c", "local", ["emb-3"], {"models": [{"id": "emb-3", "embedding": True}]}),
    ) as (url, fakes):
        fakes["a"].script("emb", status(503))
        raw = await oai(url).embeddings.with_raw_response.create(model="emb", input="x")
        fakes["b"].script("emb", status(503))
        failed = await post(url, "/embeddings", {"model": "emb", "input": "x"})
        refused = await post(url, "/embeddings", {"model": "auto", "input": "x"})
        chat = await oai(url).chat.completions.create(model="auto", messages=USER)
    assert raw.headers["x-lanes-lane"] == "b" and raw.headers["x-lanes-model"] == "emb"
    assert failed.status_code == 503
    assert {
        r.model for f in fakes.values() for r in f.requests() if r.path.endswith("/embeddings")
    } == {"emb"}
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "model"
    assert chat.choices[0].message.content == ANSWER and chat.model == "chat"


async def test_embeddings_keep_consent_and_the_ceiling():
    """A paid embedding needs consent and stays under the ceiling; its worst case is every byte
    it sends, at the input price."""
    async with open_sidecar(
        ("paid", "paid", ["x"], PAID_EMBEDDING), policy={"free_tier_fallback": "off"}
    ) as (url, fakes):
        unconsented = await post(url, "/embeddings", {"model": "emb", "input": "hello"})
        named = await post(url, "/embeddings", {"model": "paid/emb", "input": "hello"})
    async with open_sidecar(
        ("paid", "paid", ["x"], PAID_EMBEDDING),
        policy={"free_tier_fallback": "allow", "paid_ceiling_usd_per_day": 5e-4},
    ) as (url, fakes):
        # the whole body sent counts at $10/Mtok: about 30 bytes, $3e-4; then 130 bytes, $1.3e-3
        small = await post(url, "/embeddings", {"model": "emb", "input": "hi"})
        large = await post(url, "/embeddings", {"model": "emb", "input": "x" * 100})
    assert (
        unconsented.status_code == 503
        and "paid fallback off" in unconsented.json()["error"]["message"]
    )
    assert named.status_code == 200 and float(named.headers["x-lanes-cost-usd"]) > 0
    assert small.status_code == 200 and large.status_code == 429
    assert large.json()["error"]["code"] == "paid_budget_exhausted"
    assert len(fakes["paid"].requests()) == 1


async def test_models_retrieve_and_created():
    """models.retrieve finds auto, an alias and lane/model ids (slashes and colons included), each
    with a real created; an unknown id is a 404."""
    async with open_sidecar(
        (
            "local",
            "local",
            ["llama3.2:3b"],
            {"models": [{"id": "llama3.2:3b"}, {"id": "emb", "embedding": True}]},
        ),
        aliases={"fast": ["local/llama3.2:3b"]},
    ) as (url, fakes):
        client = oai(url)
        local = await client.models.retrieve("local/llama3.2:3b")
        alias = await client.models.retrieve("fast")
        listed = await client.models.list()
        embedding = await client.models.retrieve("local/emb")
        with pytest.raises(openai.NotFoundError):
            await client.models.retrieve("local/nope")
    assert local.id == "local/llama3.2:3b" and local.owned_by and local.object == "model"
    assert isinstance(local.created, int) and local.created > 1_700_000_000
    assert alias.created == local.created
    assert all(isinstance(m.created, int) for m in listed.data)
    assert embedding.model_extra and embedding.model_extra["embedding"] is True


async def test_what_a_translated_request_drops_is_logged_and_never_sent(caplog):
    """client_metadata and the like reach no upstream and are named on the lanes.jobs line; the
    effort reaches the model that declares reasoning, and only it."""
    caplog.set_level(logging.INFO, logger="lanes.jobs")
    thinker = {"models": [{"id": "thinker", "reasoning": True}]}
    async with open_sidecar(("a", "local", ["plain"]), ("b", "local", ["thinker"], thinker)) as (
        url,
        fakes,
    ):
        body = {
            "input": "hi",
            "client_metadata": {"session_id": "s-1"},
            "store": False,
            "reasoning": {"effort": "high", "summary": "auto"},
        }
        for model in ("a/plain", "b/thinker"):
            reply = await post(url, "/responses", {**body, "model": model})
            assert reply.status_code == 200, reply.text
    plain, thought = fakes["a"].requests()[0].body, fakes["b"].requests()[0].body
    assert "client_metadata" not in plain and "reasoning_effort" not in plain
    assert thought["reasoning_effort"] == "high" and "s-1" not in json.dumps(thought)
    lines = [r.getMessage() for r in caplog.records if r.name == "lanes.jobs"]
    assert len(lines) == 2
    assert all("dropped=client_metadata,store,reasoning.summary" in line for line in lines)


@pytest.mark.free_lane  # its lanes are borrowed-free ones
async def test_the_beta_output_format_field_asks_for_structured_output(simulated):
    """LiteLLM (1.110) and the beta structured-outputs header send the schema as a top-level
    `output_format`: it is structured output like `output_config.format`, not a field to drop
    (the client would get prose where it asked for JSON)."""
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "required": ["a"],
        "additionalProperties": False,
    }
    body = {
        "model": "claude-sonnet-4-6",
        "max_tokens": 200,
        "messages": [{"role": "user", "content": "give"}],
        "output_format": {"type": "json_schema", "schema": schema},
    }
    headers = {"anthropic-beta": "structured-outputs-2025-11-13", "x-api-key": "unused"}
    async with httpx2.AsyncClient(trust_env=False, timeout=10) as http:
        answer = await http.post(
            f"{simulated.removesuffix('/v1')}/v1/messages", json=body, headers=headers
        )
    assert answer.status_code == 200, answer.text
    [block] = answer.json()["content"]
    assert isinstance(json.loads(block["text"])["a"], int)


@pytest.mark.free_lane  # with the free lanes off, the simulator's one paid model prices no image
async def test_an_image_in_a_tool_result_is_not_refused(simulated):
    """Claude Code's Read tool on an image answers with a tool_result holding an image block:
    the request is served (the image carried to the model as a user image after the tool
    message), not refused with 400 'only text is supported in a tool result'."""
    png = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}
    body = {
        "model": "claude-sonnet-4-6",
        "max_tokens": 50,
        "tools": [{"name": "Read", "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": "what is in shot.png"},
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
                        "content": [{"type": "image", "source": png}],
                    }
                ],
            },
        ],
    }
    async with httpx2.AsyncClient(trust_env=False, timeout=10) as http:
        answer = await http.post(
            f"{simulated.removesuffix('/v1')}/v1/messages",
            json=body,
            headers={"x-api-key": "unused"},
        )
    assert answer.status_code == 200, answer.text

"""Gemini's API door over real loopback sockets, in front of fake providers: generateContent,
streamGenerateContent (SSE with `?alt=sse`, one JSON array without), countTokens and the model
list — with the same policies as chat (fallback, recovery, deadlines, quotas), the client key as
Google's clients send it, every refusal in Google's shape, and the requests Gemini CLI really sent
(tests/fixtures/clients/gemini-*.json) served."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import httpx2
import pytest

from lanes.testing import ANSWER, answer, hang, rate_limited, status, stream_cut
from sidecar import CLIENT_KEY, open_sidecar

LOCAL = ("local", "local", ["local-model"])
PREFILL = {
    "models": [
        {"id": "paid-model", "input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0, "prefill": True}
    ]
}
USER: Any = [{"role": "user", "parts": [{"text": "Weather in Paris?"}]}]
WEATHER: Any = {
    "functionDeclarations": [
        {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "OBJECT",
                "properties": {"city": {"type": "STRING"}},
                "required": ["city"],
            },
        }
    ]
}
CLIENTS = Path(__file__).parent / "fixtures" / "clients"
#: Gemini-style names, as Gemini CLI asks for them, routed to the local fake.
GEMINI_NAMES: dict[str, Any] = {
    "aliases": {"g": ["local/local-model"]},
    "alias_patterns": {"gemini-*": "g"},
}


def base(url: str) -> str:
    return url.removesuffix("/v1")


async def post(
    url: str, path: str, body: Any, headers: dict[str, str] | None = None
) -> httpx2.Response:
    async with httpx2.AsyncClient(trust_env=False, timeout=10) as http:
        return await http.post(f"{base(url)}{path}", json=body, headers=headers or {})


def sse_data(raw: bytes) -> list[dict[str, Any]]:
    """The `data:` events of a Gemini stream (nothing else may be in it but blank lines)."""
    lines = raw.decode().splitlines()
    assert all(line == "" or line.startswith("data: ") for line in lines), lines
    return [json.loads(line[6:]) for line in lines if line]


def parts(responses: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for r in responses for p in r["candidates"][0]["content"]["parts"]]


def text(responses: list[dict[str, Any]]) -> str:
    return "".join(p.get("text", "") for p in parts(responses))


async def test_generate_content_answers_and_sends_a_chat_upstream():
    """generateContent: one candidate with the answer, usage and who served it; upstream, a chat
    completion with the system message and the generation parameters."""
    async with open_sidecar(LOCAL) as (url, fakes):
        reply = await post(
            url,
            "/v1beta/models/local-model:generateContent",
            {
                "systemInstruction": {"parts": [{"text": "Be brief"}]},
                "contents": USER,
                "generationConfig": {"maxOutputTokens": 100, "temperature": 0.2, "topK": 5},
            },
        )
    sent = fakes["local"].requests()[0]
    assert reply.status_code == 200, reply.text
    said = reply.json()
    assert text([said]) == ANSWER
    assert said["candidates"][0]["finishReason"] == "STOP"
    assert said["usageMetadata"]["candidatesTokenCount"] == len(ANSWER) // 4
    assert said["modelVersion"] == "local-model"
    assert said["responseId"] == reply.headers["x-lanes-request-id"]
    assert reply.headers["x-lanes-lane"] == "local"
    assert sent.path == "/v1/chat/completions"
    assert sent.body["messages"][0] == {"role": "system", "content": "Be brief"}
    assert (sent.body["max_tokens"], sent.body["temperature"], sent.body["top_k"]) == (100, 0.2, 5)


async def test_stream_as_sse_and_as_a_json_array():
    """streamGenerateContent with alt=sse: `data:` events only (no SSE comment, which Google's
    JavaScript SDK could not read past); without it, one JSON array. Both add up to the answer,
    the last element with the finish reason and the usage."""
    async with open_sidecar(LOCAL) as (url, fakes):
        path = "/v1beta/models/local-model:streamGenerateContent"
        sse = await post(url, f"{path}?alt=sse", {"contents": USER})
        array = await post(url, path, {"contents": USER})
    events = sse_data(sse.content)
    elements = json.loads(array.content)
    assert sse.headers["content-type"] == "text/event-stream"
    assert array.headers["content-type"] == "application/json"
    for said in (events, elements):
        assert text(said) == ANSWER and len(said) > 2
        assert said[-1]["candidates"][0]["finishReason"] == "STOP"
        assert said[-1]["usageMetadata"]["totalTokenCount"] > 0
        assert all("usageMetadata" not in r for r in said[:-1])


async def test_a_function_call_round_trip():
    """A declared function is called (a functionCall with an id and object args); its
    functionResponse goes back as a tool message answering that call; the answer follows — and
    streamed, the call arrives whole."""
    async with open_sidecar(LOCAL) as (url, fakes):
        path = "/v1beta/models/local-model:generateContent"
        first = await post(url, path, {"contents": USER, "tools": [WEATHER]})
        [part] = first.json()["candidates"][0]["content"]["parts"]
        call = part["functionCall"]
        follow_up = [
            *USER,
            {"role": "model", "parts": [{"functionCall": call}]},
            {
                "role": "user",
                "parts": [
                    {"functionResponse": {"name": call["name"], "response": {"output": "sunny"}}}
                ],
            },
        ]
        final = await post(url, path, {"contents": follow_up, "tools": [WEATHER]})
        streamed = await post(
            url,
            "/v1beta/models/local-model:streamGenerateContent?alt=sse",
            {"contents": USER, "tools": [WEATHER]},
        )
    upstream = fakes["local"].requests()[1].body["messages"]
    assert call["name"] == "get_weather" and call["args"] == {"city": "city"} and call["id"]
    assert text([final.json()]) == ANSWER
    assert upstream[1]["tool_calls"][0]["id"] == call["id"]
    assert upstream[2] == {
        "role": "tool",
        "tool_call_id": call["id"],
        "content": '{"output": "sunny"}',
    }
    assert fakes["local"].requests()[0].body["tools"][0]["function"]["parameters"] == {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    }
    calls = [p["functionCall"] for p in parts(sse_data(streamed.content)) if "functionCall" in p]
    assert [c["args"] for c in calls] == [{"city": "city"}]


async def test_the_key_comes_as_x_goog_api_key_or_the_key_parameter(caplog):
    """With client keys configured, x-goog-api-key or ?key= is the client key; a wrong one is a
    401 UNAUTHENTICATED in Google's shape; the key is never echoed nor logged. On /v1/models,
    google-genai's default, Google's SDKs (x-goog-api-client) get Gemini's list and OpenAI's
    clients OpenAI's."""
    caplog.set_level(logging.DEBUG)
    server = {"clients": {"alice": "CLIENT_KEY"}}
    path = "/v1beta/models/local-model:generateContent"
    async with open_sidecar(LOCAL, server=server) as (url, fakes):
        by_header = await post(url, path, {"contents": USER}, {"x-goog-api-key": CLIENT_KEY})
        by_query = await post(url, f"{path}?key={CLIENT_KEY}", {"contents": USER})
        wrong = await post(url, path, {"contents": USER}, {"x-goog-api-key": "wrong-key"})
        listed = await post(url, "/v1beta/models", None)  # POST: not a route
        google = {"x-goog-api-key": CLIENT_KEY, "x-goog-api-client": "google-genai-sdk/3.6.1"}
        async with httpx2.AsyncClient(trust_env=False) as http:
            models = await http.get(f"{base(url)}/v1beta/models?key={CLIENT_KEY}")
            v1_google = await http.get(f"{base(url)}/v1/models", headers=google)
            v1_one = await http.get(f"{base(url)}/v1/models/local/local-model", headers=google)
            v1_openai = await http.get(
                f"{base(url)}/v1/models", headers={"authorization": f"Bearer {CLIENT_KEY}"}
            )
    assert by_header.status_code == 200 and by_query.status_code == 200
    assert wrong.status_code == 401
    assert wrong.json()["error"]["status"] == "UNAUTHENTICATED"
    assert (
        wrong.json()["error"]["message"] == "unknown client key" and "wrong-key" not in wrong.text
    )
    assert listed.status_code == 405 and models.status_code == 200
    assert v1_google.json()["models"][0]["name"] == "models/auto"
    assert v1_one.json()["name"] == "models/local/local-model"
    assert v1_openai.json()["data"][0]["id"] == "auto"
    assert caplog.records  # the jobs were logged: without the key
    assert CLIENT_KEY not in caplog.text and "wrong-key" not in caplog.text


async def test_a_malformed_request_is_a_google_shaped_400_naming_the_field():
    """A bad field is a 400 INVALID_ARGUMENT naming it (message and field violation); an unknown
    model or method a 404 NOT_FOUND; a body that is not JSON a 400 — all in Google's shape, and
    nothing sent upstream."""
    async with open_sidecar(LOCAL) as (url, fakes):
        bad = await post(
            url,
            "/v1beta/models/local-model:generateContent",
            {
                "contents": [
                    {
                        "role": "user",
                        "parts": [{"inlineData": {"mimeType": "audio/wav", "data": ""}}],
                    }
                ]
            },
        )
        unknown_model = await post(
            url, "/v1beta/models/gemini-9:generateContent", {"contents": USER}
        )
        unknown_method = await post(url, "/v1beta/models/local-model:embedContent", {})
        no_route = await post(url, "/v1beta/tunedModels/x:generateContent", {})
        async with httpx2.AsyncClient(trust_env=False) as http:
            not_json = await http.post(
                f"{base(url)}/v1beta/models/local-model:generateContent", content=b"{nope"
            )
    error = bad.json()["error"]
    assert bad.status_code == 400 and error["status"] == "INVALID_ARGUMENT"
    field = "contents[0].parts[0].inlineData.mimeType"
    assert error["message"].startswith(field)
    violations = [d for d in error["details"] if d["@type"].endswith("google.rpc.BadRequest")]
    assert violations[0]["fieldViolations"][0]["field"] == field
    for reply in (unknown_model, unknown_method, no_route):
        assert reply.status_code == 404 and reply.json()["error"]["status"] == "NOT_FOUND"
    assert not_json.status_code == 400 and not_json.json()["error"]["code"] == 400
    assert fakes["local"].requests() == []


@pytest.mark.free_lane
async def test_free_capacity_gone_is_resource_exhausted_with_retry_info():
    """Free capacity gone, fallback off: 429 RESOURCE_EXHAUSTED whose RetryInfo says what
    Retry-After says (what Gemini CLI waits on)."""
    async with open_sidecar(
        ("free", "free", ["free-model"]), policy={"free_tier_fallback": "off"}
    ) as (url, fakes):
        fakes["free"].script("free-model", rate_limited(retry_after=7))
        reply = await post(url, "/v1beta/models/auto:generateContent", {"contents": USER})
    error = reply.json()["error"]
    assert reply.status_code == 429 and error["status"] == "RESOURCE_EXHAUSTED"
    [retry] = [d for d in error["details"] if d["@type"].endswith("RetryInfo")]
    assert retry["retryDelay"] == f"{reply.headers['retry-after']}s"
    [info] = [d for d in error["details"] if d["@type"].endswith("ErrorInfo")]
    assert info["reason"] == "FREE_TIER_EXHAUSTED"


async def test_the_deadline_and_a_broken_stream_in_google_s_words():
    """A hung upstream past the deadline: 504 DEADLINE_EXCEEDED. A stream broken with no honest
    recovery ends with an in-band error event (UNAVAILABLE, which a client retries)."""
    async with open_sidecar(LOCAL) as (url, fakes):
        fakes["local"].script("local-model", hang())
        late = await post(
            url,
            "/v1beta/models/auto:generateContent",
            {"contents": USER},
            {"X-Lanes-Deadline-Ms": "500"},
        )
        fakes["local"].script("local-model", stream_cut(after=3))
        broken = await post(
            url, "/v1beta/models/auto:streamGenerateContent?alt=sse", {"contents": USER}
        )
    assert late.status_code == 504 and late.json()["error"]["status"] == "DEADLINE_EXCEEDED"
    events = sse_data(broken.content)
    assert events[-1]["error"]["status"] == "UNAVAILABLE" and events[-1]["error"]["code"] == 502
    assert "stream cut" in events[-1]["error"]["message"]


async def test_a_cut_stream_is_recovered_and_a_failing_lane_falls_back():
    """A stream cut after three chunks resumes on a prefill fallback: the client sees the whole
    answer once; a 503 from the first lane falls back to the next."""
    async with open_sidecar(LOCAL, ("paid", "paid", ["paid-model"], PREFILL)) as (url, fakes):
        fakes["local"].script("local-model", stream_cut(after=3), stream_cut(after=3), answer())
        streamed = await post(
            url, "/v1beta/models/auto:streamGenerateContent?alt=sse", {"contents": USER}
        )
        fakes["local"].script("local-model", status(503))
        fallen = await post(url, "/v1beta/models/auto:generateContent", {"contents": USER})
    assert text(sse_data(streamed.content)) == ANSWER
    assert fallen.status_code == 200 and fallen.headers["x-lanes-route"] == "paid_fallback"


async def test_count_tokens_and_the_model_list():
    """countTokens estimates (contents, or a whole generateContentRequest) without sending
    anything; the list and one model as Gemini's API describes them, pages by pageToken."""
    async with open_sidecar(LOCAL, aliases={"fast": ["local/local-model"]}) as (url, fakes):
        counted = await post(url, "/v1beta/models/local-model:countTokens", {"contents": USER})
        wrapped = await post(
            url,
            "/v1beta/models/local-model:countTokens",
            {"generateContentRequest": {"model": "models/local-model", "contents": USER}},
        )
        async with httpx2.AsyncClient(trust_env=False) as http:
            page = (await http.get(f"{base(url)}/v1beta/models?pageSize=2")).json()
            rest = (
                await http.get(f"{base(url)}/v1beta/models?pageToken={page['nextPageToken']}")
            ).json()
            one = await http.get(f"{base(url)}/v1beta/models/local-model")
            missing = await http.get(f"{base(url)}/v1beta/models/nope")
    assert counted.json()["totalTokens"] > 0
    assert wrapped.json() == counted.json()
    assert [m["name"] for m in page["models"]] == ["models/auto", "models/fast"]
    assert [m["name"] for m in rest["models"]] == ["models/local/local-model"]
    assert "nextPageToken" not in rest
    assert one.json()["name"] == "models/local/local-model"
    assert "generateContent" in one.json()["supportedGenerationMethods"]
    assert missing.status_code == 404 and missing.json()["error"]["status"] == "NOT_FOUND"
    assert fakes["local"].requests() == []


async def test_what_is_dropped_is_logged_and_never_sent(caplog):
    """safetySettings, thinkingConfig and a field invented tomorrow reach no upstream and are
    named on the lanes.jobs line."""
    caplog.set_level(logging.INFO, logger="lanes.jobs")
    async with open_sidecar(LOCAL) as (url, fakes):
        reply = await post(
            url,
            "/v1beta/models/local-model:generateContent",
            {
                "contents": USER,
                "safetySettings": [{"category": "HARM_CATEGORY_HATE_SPEECH", "threshold": "OFF"}],
                "generationConfig": {"thinkingConfig": {"thinkingBudget": 1024}},
                "inventedTomorrow": {"x": 1},
            },
        )
    assert reply.status_code == 200, reply.text
    sent = json.dumps(fakes["local"].requests()[0].body)
    assert "HARM_CATEGORY" not in sent and "thinking" not in sent and "invented" not in sent
    [line] = [r.getMessage() for r in caplog.records if r.name == "lanes.jobs"]
    assert "dropped=safetySettings,inventedTomorrow,generationConfig.thinkingConfig" in line


def capture(name: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads((CLIENTS / f"{name}.json").read_text())
    return found


async def test_the_requests_gemini_cli_sent_are_served():
    """Gemini CLI 0.61.0's own requests, replayed: its router's JSON question (responseJsonSchema
    with Gemini's upper-case types) is answered with JSON valid against it; its first turn,
    streamed, calls its first tool — a function call whole, with an id."""
    router, turn = capture("gemini-0"), capture("gemini-1")
    async with open_sidecar(LOCAL, **GEMINI_NAMES) as (url, fakes):
        routed = await post(url, router["path"], router["body"])
        streamed = await post(url, turn["path"], turn["body"])
    assert routed.status_code == 200, routed.text
    schema = router["body"]["generationConfig"]["responseJsonSchema"]
    verdict = json.loads(text([routed.json()]))
    assert set(verdict) == set(schema["required"])
    assert isinstance(verdict["complexity_score"], int)
    sent = fakes["local"].requests()[0].body["response_format"]["json_schema"]["schema"]
    assert sent["type"] == "object" and sent["properties"]["complexity_score"]["type"] == "integer"
    assert streamed.status_code == 200, streamed.text
    [call] = [p["functionCall"] for p in parts(sse_data(streamed.content)) if "functionCall" in p]
    declared = turn["body"]["tools"][0]["functionDeclarations"][0]["name"]
    assert call["name"] == declared and call["id"]


async def test_consent_is_asked_for_in_google_s_shape():
    """ask with no decision in time: 429 RESOURCE_EXHAUSTED whose ErrorInfo names the approval
    (its id and where to give it), the same id as X-Lanes-Approval; nothing paid is sent."""
    async with open_sidecar(
        LOCAL,
        ("paid", "paid", ["paid-model"]),
        policy={"free_tier_fallback": "ask", "approval_wait_s": 0.2},
    ) as (url, fakes):
        fakes["local"].script("local-model", status(503))
        asked = await post(url, "/v1beta/models/auto:generateContent", {"contents": USER})
    error = asked.json()["error"]
    assert asked.status_code == 429 and error["status"] == "RESOURCE_EXHAUSTED"
    [info] = [d for d in error["details"] if d["@type"].endswith("ErrorInfo")]
    assert info["reason"] == "APPROVAL_REQUIRED"
    assert info["metadata"]["approval_id"] == asked.headers["x-lanes-approval"]
    assert info["metadata"]["approval_url"] == "/"
    assert fakes["paid"].requests() == []

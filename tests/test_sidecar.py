"""The sidecar over real loopback sockets, with the official `openai` package as the client."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx2
import openai
import pytest
import trio
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

from lanes.testing import ANSWER, answer, garbage, hang, rate_limited, status
from sidecar import CLIENT_KEY, open_sidecar

MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Tell me the pangram, please."}
]
PREFILL = {
    "models": [
        {"id": "paid-model", "input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0, "prefill": True}
    ]
}


def client(url: str, **kw) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=url,
        api_key=kw.pop("api_key", "unused"),
        max_retries=kw.pop("max_retries", 0),
        **kw,
    )


async def test_chat_with_the_openai_sdk():
    """A plain chat completion: the upstream's body, and who served it in X-Lanes-* headers."""
    async with open_sidecar(
        ("local", "local", ["local-model"]), ("paid", "paid", ["paid-model"])
    ) as (url, fakes):
        raw = await client(url).chat.completions.with_raw_response.create(
            model="auto", messages=MESSAGES
        )
        completion = raw.parse()
    assert completion.choices[0].message.content == ANSWER and completion.model == "local-model"
    assert raw.headers["x-lanes-lane"] == "local" and raw.headers["x-lanes-route"] == "local"
    assert raw.headers["x-lanes-attempts"] == "1" and raw.headers["x-lanes-cost-usd"] == "0"
    assert (
        b'"model": "local-model"' in raw.http_response.content
    )  # the upstream's own bytes, not re-encoded


async def test_stream_with_the_openai_sdk():
    """stream=True arrives as SSE chunks that the SDK reassembles into the whole answer."""
    async with open_sidecar(("local", "local", ["local-model"])) as (url, fakes):
        stream = await client(url).chat.completions.create(
            model="auto", messages=MESSAGES, stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == ANSWER


async def test_tools_pass_through():
    """tools, tool_choice and other params reach the upstream untouched."""
    tools: list[ChatCompletionToolParam] = [
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    ]
    async with open_sidecar(("local", "local", ["local-model"])) as (url, fakes):
        await client(url).chat.completions.create(
            model="auto",
            messages=MESSAGES,
            tools=tools,
            tool_choice="auto",
            temperature=0.1,
            seed=3,
        )
    body = fakes["local"].requests()[0].body
    assert body["tools"] == tools and body["tool_choice"] == "auto" and body["seed"] == 3


async def post(
    url: str, body: bytes | dict[str, Any], headers: dict[str, str] | None = None
) -> httpx2.Response:
    async with httpx2.AsyncClient(trust_env=False) as http:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return await http.post(
            f"{url}/chat/completions",
            content=content,
            headers={"content-type": "application/json", **(headers or {})},
        )


def error_of(response: httpx2.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body["error"]) >= {"message", "type", "code", "param"}
    return body["error"]


async def test_malformed_requests_name_the_field():
    """Bad JSON, a bad schema, bad headers: 400 in OpenAI's shape, naming what is wrong."""
    async with open_sidecar(("local", "local", ["local-model"])) as (url, fakes):
        bad_json = await post(url, b"{not json")
        no_messages = await post(url, {"model": "auto"})
        bad_role = await post(
            url, {"messages": [{"role": "user", "content": "x"}, {"role": "wizard"}]}
        )
        bad_deadline = await post(url, {"messages": MESSAGES}, {"X-Lanes-Deadline-Ms": "soon"})
        unknown = await post(url, {"model": "gpt-9", "messages": MESSAGES})
    assert bad_json.status_code == 400 and error_of(bad_json)["code"] == "invalid_json"
    assert no_messages.status_code == 400 and error_of(no_messages)["param"] == "messages"
    assert error_of(bad_role)["param"] == "messages[1].role"
    assert error_of(bad_deadline)["param"] == "X-Lanes-Deadline-Ms"
    assert unknown.status_code == 404 and error_of(unknown)["code"] == "model_not_found"
    assert fakes["local"].requests() == []


async def test_client_keys_and_body_limit():
    """With client keys configured an unknown key is 401; a body over the limit is 413."""
    server = {"clients": {"alice": "CLIENT_KEY"}, "max_body_bytes": 2000}
    async with open_sidecar(("local", "local", ["local-model"]), server=server) as (url, fakes):
        with pytest.raises(openai.AuthenticationError):
            await client(url, api_key="wrong").chat.completions.create(
                model="auto", messages=MESSAGES
            )
        ok = await client(url, api_key=CLIENT_KEY).chat.completions.create(
            model="auto", messages=MESSAGES
        )
        big = await post(
            url,
            {"messages": [{"role": "user", "content": "x" * 5000}]},
            {"Authorization": f"Bearer {CLIENT_KEY}"},
        )
    assert ok.choices[0].message.content == ANSWER
    assert big.status_code == 413 and error_of(big)["code"] == "body_too_large"


@pytest.mark.free_lane
async def test_free_tier_exhausted_is_429_with_exact_retry_after():
    """Free capacity gone, fallback off: 429, Retry-After in whole seconds, the next eligible."""
    async with open_sidecar(
        ("free", "free", ["free-model"]),
        ("paid", "paid", ["paid-model"]),
        policy={"free_tier_fallback": "off"},
    ) as (url, fakes):
        fakes["free"].script("free-model", rate_limited(retry_after=7))
        response = await post(url, {"messages": MESSAGES})
    assert response.status_code == 429 and error_of(response)["code"] == "free_tier_exhausted"
    assert response.headers["retry-after"] in {"7", "8"}
    assert response.headers["x-lanes-next-eligible"] == "free/free-model"
    assert fakes["paid"].requests() == []


@pytest.mark.free_lane
async def test_the_sdk_honours_our_retry_after():
    """The OpenAI SDK's retry waits for our Retry-After, then the reopened free model answers."""
    async with open_sidecar(
        ("free", "free", ["free-model"]), policy={"free_tier_fallback": "off"}
    ) as (url, fakes):
        fakes["free"].script("free-model", rate_limited(retry_after=1), answer())
        start = trio.current_time()
        completion = await client(url, max_retries=2).chat.completions.create(
            model="auto", messages=MESSAGES
        )
        waited = trio.current_time() - start
    assert completion.choices[0].message.content == ANSWER
    assert waited >= 1.0 and len(fakes["free"].requests()) == 2


async def test_approval_required_and_paid_budget_errors():
    """ask with no decision in time: 429 approval_required with id and URL; a spent ceiling: 429."""
    async with open_sidecar(
        ("free", "free", ["free-model"]),
        ("paid", "paid", ["paid-model"]),
        policy={"free_tier_fallback": "ask", "approval_wait_s": 0.2},
    ) as (url, fakes):
        fakes["free"].script("free-model", rate_limited(retry_after=30))
        asked = await post(url, {"messages": MESSAGES})
    async with open_sidecar(
        ("paid", "paid", ["paid-model"]),
        policy={"free_tier_fallback": "allow", "paid_ceiling_usd_per_day": 0.0},
    ) as (url, fakes):
        broke = await post(url, {"messages": MESSAGES})
    assert asked.status_code == 429 and error_of(asked)["code"] == "approval_required"
    assert error_of(asked)["approval_id"].startswith("ap-") and "retry-after" in asked.headers
    assert broke.status_code == 429 and error_of(broke)["code"] == "paid_budget_exhausted"


async def test_deadline_and_garbage_errors(autojump_clock):
    """A hung upstream past X-Lanes-Deadline-Ms is 504; an upstream's garbage is 502. (On the
    virtual clock: the 504 comes at the deadline exactly, whatever the machine's load; a sidecar
    that missed it would leave the client to its own 5 s timeout.)"""
    async with open_sidecar(("local", "local", ["local-model"])) as (url, fakes):
        fakes["local"].script("local-model", hang())
        start = trio.current_time()
        late = await post(url, {"messages": MESSAGES}, {"X-Lanes-Deadline-Ms": "700"})
        elapsed = trio.current_time() - start
        fakes["local"].script("local-model", garbage())
        junk = await post(url, {"messages": MESSAGES})
    assert late.status_code == 504 and error_of(late)["code"] == "deadline_exceeded"
    assert 0.7 - 1e-9 <= elapsed < 1.5  # (float rounding of the virtual clock)
    assert junk.status_code == 502 and error_of(junk)["code"] == "bad_upstream_response"


async def test_final_upstream_error_keeps_its_status():
    async with open_sidecar(
        ("local", "local", ["local-model"]), ("paid", "paid", ["paid-model"])
    ) as (url, fakes):
        fakes["local"].script(
            "local-model",
            status(400, {"error": {"message": "bad temperature", "code": "invalid_value"}}),
        )
        response = await post(url, {"messages": MESSAGES})
    assert response.status_code == 400 and error_of(response)["code"] == "invalid_value"
    assert fakes["paid"].requests() == []


async def test_ops_endpoints():
    """/health, /ready, /v1/models, /v1/lanes, the runtime switch, /metrics."""
    async with open_sidecar(
        ("local", "local", ["local-model"]), ("paid", "paid", ["paid-model"])
    ) as (url, fakes):
        base = url[:-3]
        async with httpx2.AsyncClient(trust_env=False) as http:
            health = await http.get(f"{base}/health")
            ready = await http.get(f"{base}/ready")
            models = (await http.get(f"{url}/models")).json()
            off = await http.post(f"{url}/lanes/local/off", json={})
            served = await post(url, {"messages": MESSAGES})
            lanes = (await http.get(f"{url}/lanes")).json()
            metrics = (await http.get(f"{base}/metrics")).text
            missing = await http.post(f"{url}/lanes/nope/off", json={})
    assert health.json() == {"status": "ok"} and ready.json()["ready"] is True
    assert [m["id"] for m in models["data"]] == ["auto", "local/local-model", "paid/paid-model"]
    assert off.json() == {"lane": "local", "off": True} and served.headers["x-lanes-lane"] == "paid"
    assert [entry["name"] for entry in lanes["lanes"]] == ["local", "paid"] and (
        lanes["recent"][0]["lane"] == "paid"
    )
    served_paid = 'lane="paid",model="paid-model",outcome="ok",route="paid_fallback"'
    assert f"lanes_requests_total{{{served_paid}}} 1.0" in metrics
    assert 'lanes_breaker_state{lane="local"} 0.0' in metrics and "lanes_paid_spend_usd" in metrics
    assert missing.status_code == 404


async def test_client_disconnect_cancels_the_upstream():
    """A client gone mid-stream stops the upstream at once: the fake sees its socket close."""
    async with open_sidecar(("local", "local", ["local-model"])) as (url, fakes):
        fakes["local"].script("local-model", answer(chunk_delay_s=0.2))
        async with (
            httpx2.AsyncClient(trust_env=False) as http,
            http.stream(
                "POST", f"{url}/chat/completions", json={"messages": MESSAGES, "stream": True}
            ) as response,
        ):
            async for _ in response.aiter_lines():
                break
        await trio.sleep(0.5)
        assert fakes["local"].open_connections() == 0


async def sse_events(url: str, body: dict[str, Any]) -> list[str]:
    async with (
        httpx2.AsyncClient(trust_env=False, timeout=30) as http,
        http.stream("POST", f"{url}/chat/completions", json={**body, "stream": True}) as response,
    ):
        return [line async for line in response.aiter_lines() if line]


def text_and_end(events: list[str]) -> tuple[str, str]:
    text, end = "", "none"
    for line in events:
        if line == "data: [DONE]":
            end = "done"
        elif line.startswith("data: "):
            payload = json.loads(line[6:])
            if "error" in payload:
                end = "error:" + payload["error"]["message"]
            for choice in payload.get("choices", []):
                text += choice.get("delta", {}).get("content") or ""
    return text, end


async def test_cut_stream_resumes_through_a_prefill_capable_fallback():
    """A stream cut after three chunks resumes by prefill: the client sees the whole answer once."""
    from lanes.testing import stream_cut

    async with open_sidecar(
        ("local", "local", ["local-model"]), ("paid", "paid", ["paid-model"], PREFILL)
    ) as (url, fakes):
        fakes["local"].script("local-model", stream_cut(after=3))
        events = await sse_events(url, {"messages": MESSAGES})
        resumed = fakes["paid"].requests()[0].body["messages"][-1]
    text, end = text_and_end(events)
    assert (text, end) == (ANSWER, "done")
    assert (
        resumed["role"] == "assistant"
        and ANSWER.startswith(resumed["content"])
        and resumed["content"]
    )


async def test_cut_stream_whose_fallback_rejects_prefill_is_regenerated_exactly():
    """The fallback refuses the prefill: it regenerates; only the exact extension is delivered."""
    from lanes.testing import stream_cut

    async with open_sidecar(
        ("local", "local", ["local-model"]), ("paid", "paid", ["paid-model"], PREFILL)
    ) as (url, fakes):
        fakes["local"].script("local-model", stream_cut(after=3))
        fakes["paid"].prefill = False
        events = await sse_events(url, {"messages": MESSAGES})
    assert text_and_end(events) == (ANSWER, "done")
    assert len(fakes["paid"].requests()) == 2  # the refused prefill, then the regeneration


async def test_cut_stream_with_no_honest_recovery_ends_in_an_error_event():
    """When the regenerated answer differs, nothing is spliced on: an in-band error names the real
    failure (the cut), not the fallback's prefill refusal, and there is no [DONE]."""
    from lanes.testing import stream_cut

    async with open_sidecar(
        ("local", "local", ["local-model"]), ("paid", "paid", ["paid-model"], PREFILL)
    ) as (url, fakes):
        fakes["local"].script("local-model", stream_cut(after=3))
        fakes["paid"].script("paid-model", answer(text="A completely different answer."))
        fakes["paid"].prefill = False
        events = await sse_events(url, {"messages": MESSAGES})
    text, end = text_and_end(events)
    assert end.startswith("error:") and "stream cut" in end and "prefill" not in end
    assert ANSWER.startswith(text) and text != ANSWER


@pytest.mark.parametrize("fault", ["slow-first-token", "stalled", "malformed", "no-done"])
async def test_stream_faults_never_end_truncated_as_success(fault):
    """Slow first token → fallback; stalled → resumed elsewhere; malformed chunk skipped; no
    [DONE] finalised — in every case the client gets the whole answer and a clean end, or an error
    event."""
    from lanes.testing import malformed_chunk, no_done, stream_stall

    behaviours = {
        "slow-first-token": answer(delay_s=3),
        "stalled": stream_stall(after=2),
        "malformed": malformed_chunk(after=2),
        "no-done": no_done(),
    }
    fast = {"first_token_s": 1.0, "idle_s": 1.0}
    async with open_sidecar(
        ("local", "local", ["local-model"], fast), ("paid", "paid", ["paid-model"])
    ) as (url, fakes):
        fakes["local"].script("local-model", behaviours[fault])
        events = await sse_events(url, {"messages": MESSAGES})
    text, end = text_and_end(events)
    assert (text, end) == (ANSWER, "done")


async def test_nothing_secret_reaches_logs_pages_metrics_or_errors(caplog):
    """Keys and prompt text appear in no log line, page, metric or error produced by a busy run."""
    from helpers import FREE_KEY, PAID_KEY

    caplog.set_level(logging.DEBUG)
    secret_prompt = "my-secret-prompt-7f3a9"
    messages = [{"role": "user", "content": secret_prompt}]
    seen = []
    async with open_sidecar(
        ("free", "free", ["free-model"]),
        ("paid", "paid", ["paid-model"]),
        server={"clients": {"alice": "CLIENT_KEY"}},
    ) as (url, fakes):
        fakes["free"].script(
            "free-model",
            status(401, {"error": {"message": f"Invalid API key {FREE_KEY}"}}),
            rate_limited(retry_after=1),
            answer(),
        )
        headers = {"Authorization": f"Bearer {CLIENT_KEY}"}
        base = url[:-3]
        async with httpx2.AsyncClient(trust_env=False) as http:
            for body in (
                {"messages": messages},
                {"messages": messages},
                {"messages": messages, "stream": True},
                {"messages": messages, "model": "nope"},
                b"{bad",
            ):
                raw = body if isinstance(body, bytes) else json.dumps(body).encode()
                r = await http.post(f"{url}/chat/completions", content=raw, headers=headers)
                seen.append(r.text)
            for path in (
                "/",
                "/metrics",
                "/v1/lanes",
                "/v1/models",
                "/v1/approvals",
                "/health",
                "/ready",
            ):
                seen.append((await http.get(base + path)).text)
    seen += [record.getMessage() for record in caplog.records]
    haystack = "\n".join(seen)
    for needle in (FREE_KEY, PAID_KEY, CLIENT_KEY, secret_prompt):
        assert needle not in haystack


@pytest.mark.free_lane
async def test_x_lanes_max_wait_waits_for_the_free_reset_instead_of_a_429():
    """`X-Lanes-Max-Wait: 5`: the free model answers 429 with Retry-After 1; the request waits for
    the reset and is answered free. Without the header it is the exact 429 at once; a value that
    is not a number of seconds from 1 to 3600 is a 400 naming the header."""
    async with open_sidecar(
        ("free", "free", ["free-model"]), policy={"free_tier_fallback": "off"}
    ) as (url, fakes):
        fakes["free"].script("free-model", rate_limited(retry_after=1), answer())
        start = trio.current_time()
        waited = await post(url, {"messages": MESSAGES}, {"x-lanes-max-wait": "5"})
        took = trio.current_time() - start
        fakes["free"].script("free-model", rate_limited(retry_after=30))
        refused = await post(url, {"messages": MESSAGES})
        bad = await post(url, {"messages": MESSAGES}, {"x-lanes-max-wait": "soon"})
    assert waited.status_code == 200 and waited.headers["x-lanes-lane"] == "free" and took >= 1.0
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 29
    assert bad.status_code == 400 and error_of(bad)["param"] == "X-Lanes-Max-Wait"

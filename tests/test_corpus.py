"""The recorded-provider corpus (`tests/corpus`, sources in `tests/corpus/SOURCES.md`): every
transcript is replayed verbatim by a fake on 127.0.0.1, through the sidecar and the provider's own
lane module, and read by the real SDKs — the OpenAI SDK on chat completions and the Responses API,
the Anthropic SDK on the Messages API. Content, reasoning, tool calls, finish reason and usage must
arrive as `expected.json` says (a reading of each transcript made apart from lanes; its `tokens`
is what the job is counted: prompt + completion, or a larger `total_tokens`, which providers that
bill hidden reasoning tokens report); errors keep their status class; rate-limit headers reach the
FreeTierManager. A model list (`"catalog": true`) is no chat answer: `tests/test_llamacpp.py`
replays those."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import openai
import pytest
import trio

from lanes.testing import replay
from sidecar import open_sidecar

CORPUS = Path(__file__).parent / "corpus"
EXPECTED: dict[str, dict[str, Any]] = json.loads((CORPUS / "expected.json").read_text())
ANSWERS = {name: e for name, e in EXPECTED.items() if not e.get("catalog")}
OK = sorted(name for name, e in ANSWERS.items() if "error" not in e)
FAILING = sorted(name for name, e in ANSWERS.items() if "error" in e)
MESSAGES: list[Any] = [{"role": "user", "content": "Answer as you did."}]
#: What the Messages API calls each chat finish reason.
STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def transcript(name: str) -> bytes:
    return (CORPUS / name).read_bytes()


def lane_of(name: str) -> tuple[Any, ...]:
    """The provider's own lane module in front of the fake, serving one model. Its kind is
    `local` (owned capacity, which `FREE_LANE=off` leaves on): the relay is the same whatever the
    tier, and what the FreeTierManager reads from headers does not depend on it."""
    provider = name.split("/")[0]
    return (provider, "local", ["corpus-model"], {"module": provider})


async def story(url: str, request_id: str) -> dict[str, Any]:
    async with httpx2.AsyncClient(trust_env=False, timeout=10) as http:
        with trio.fail_after(10):
            found = await http.get(f"{url}/requests/{request_id}")
            while found.status_code != 200:  # the audit row is written in the background
                await trio.sleep(0.05)
                found = await http.get(f"{url}/requests/{request_id}")
    return found.json()


def usage_pair(usage: Any) -> list[int] | None:
    return [usage["prompt_tokens"], usage["completion_tokens"]] if usage else None


def extension_usage(obj: dict[str, Any]) -> Any:
    """What a chat client reads as usage: `usage`, else a vendor extension's (`x_<vendor>`)."""
    if obj.get("usage"):
        return obj["usage"]
    return next(
        (v["usage"] for k, v in obj.items() if k.startswith("x_") and (v or {}).get("usage")),
        None,
    )


class Chat:
    """What the OpenAI SDK read from chat completions."""

    def __init__(self) -> None:
        self.text, self.reasoning = "", ""
        self.tools: dict[int, list[str]] = {}
        self.finish_reason: str | None = None
        self.usage: Any = None

    def read(self, message: Any, *, streamed: bool) -> None:
        extra = message.model_extra or {}
        self.text += message.content or ""
        thinking = extra.get("reasoning_content") or extra.get("reasoning")
        self.reasoning += thinking if isinstance(thinking, str) else ""
        for position, call in enumerate(message.tool_calls or ()):
            index = call.index if streamed and call.index is not None else position
            slot = self.tools.setdefault(index, ["", ""])
            slot[0] += (call.function.name or "") if call.function else ""
            slot[1] += (call.function.arguments or "") if call.function else ""

    def got(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "reasoning": self.reasoning,
            "tool_calls": [self.tools[i] for i in sorted(self.tools)],
            "finish_reason": self.finish_reason,
            "usage": usage_pair(self.usage),
        }


def wanted(name: str) -> dict[str, Any]:
    e = EXPECTED[name]
    return {k: e[k] for k in ("text", "reasoning", "tool_calls", "finish_reason", "usage")}


async def chat(url: str, name: str) -> tuple[Chat, str]:
    """Ask the sidecar as the OpenAI SDK does (streamed when the transcript is a stream, asking for
    the usage chunk); what it read, and the request id."""
    client = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)
    read = Chat()
    if not EXPECTED[name]["stream"]:
        raw = await client.chat.completions.with_raw_response.create(
            model="auto", messages=MESSAGES
        )
        completion = raw.parse()
        read.read(completion.choices[0].message, streamed=False)
        read.finish_reason = completion.choices[0].finish_reason
        read.usage = extension_usage(json.loads(raw.http_response.content))
        return read, raw.headers["x-lanes-request-id"]
    raw_stream = await client.chat.completions.with_raw_response.create(
        model="auto", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    async for chunk in raw_stream.parse():
        for choice in chunk.choices:
            read.read(choice.delta, streamed=True)
            read.finish_reason = choice.finish_reason or read.finish_reason
        read.usage = extension_usage(chunk.model_dump()) or read.usage
    return read, raw_stream.headers["x-lanes-request-id"]


@pytest.mark.parametrize("name", OK)
async def test_chat_completions_relay_the_transcript(name):
    """Through chat completions, the OpenAI SDK reads exactly what the provider sent — text,
    reasoning, tool calls, finish reason, usage — and the job's story says `ok` with the
    provider's token count."""
    async with open_sidecar(lane_of(name)) as (url, fakes):
        fakes[name.split("/")[0]].script("corpus-model", replay(transcript(name)))
        read, request_id = await chat(url, name)
        told = await story(url, request_id)
    assert read.got() == wanted(name)
    assert told["outcome"] == "ok"
    assert told["attempt_list"][-1]["tokens"] == EXPECTED[name]["tokens"]


@pytest.mark.parametrize("name", OK)
async def test_the_messages_api_relays_the_transcript(name):
    """Through the Messages API, the Anthropic SDK reads the same answer: a thinking block for
    the reasoning, the text, a tool_use block per call (its input the arguments), the stop reason
    and the output tokens."""
    want = EXPECTED[name]
    async with open_sidecar(lane_of(name)) as (url, fakes):
        fakes[name.split("/")[0]].script("corpus-model", replay(transcript(name)))
        claude = anthropic.AsyncAnthropic(base_url=url[:-3], api_key="unused", max_retries=0)
        message: Any
        if want["stream"]:
            async with claude.messages.stream(
                model="auto", max_tokens=64, messages=MESSAGES
            ) as stream:
                message = await stream.get_final_message()
        else:
            message = await claude.messages.create(model="auto", max_tokens=64, messages=MESSAGES)
    blocks = {kind: [b for b in message.content if b.type == kind] for kind in ("thinking", "text")}
    assert "".join(b.thinking for b in blocks["thinking"]) == want["reasoning"]
    assert "".join(b.text for b in blocks["text"]) == want["text"]
    calls = [b for b in message.content if b.type == "tool_use"]
    assert [(c.name, c.input) for c in calls] == [
        (tool, json.loads(arguments)) for tool, arguments in want["tool_calls"]
    ]
    assert message.stop_reason == STOP[want["finish_reason"]]
    if want["usage"]:
        usage = message.usage
        assert usage.output_tokens == want["usage"][1]
        assert usage.input_tokens + (usage.cache_read_input_tokens or 0) == want["usage"][0]


@pytest.mark.parametrize("name", OK)
async def test_the_responses_api_relays_the_transcript(name):
    """Through the Responses API, the OpenAI SDK reads the same answer: a reasoning item, the
    output text, a function_call item per call, and the usage."""
    want = EXPECTED[name]
    async with open_sidecar(lane_of(name)) as (url, fakes):
        fakes[name.split("/")[0]].script("corpus-model", replay(transcript(name)))
        client = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)
        response: Any
        if want["stream"]:
            async with client.responses.stream(model="auto", input="Answer as you did.") as stream:
                response = await stream.get_final_response()
        else:
            response = await client.responses.create(model="auto", input="Answer as you did.")
    reasoning = "".join(
        part.text
        for item in response.output
        if item.type == "reasoning"
        for part in item.content or ()
    )
    calls = [(i.name, i.arguments) for i in response.output if i.type == "function_call"]
    assert reasoning == want["reasoning"] and response.output_text == want["text"]
    assert calls == [tuple(call) for call in want["tool_calls"]]
    expected_status = "incomplete" if want["finish_reason"] == "length" else "completed"
    assert response.status == expected_status
    if want["usage"]:
        assert response.usage is not None
        assert [response.usage.input_tokens, response.usage.output_tokens] == want["usage"]


@pytest.mark.parametrize("name", FAILING)
async def test_errors_keep_their_status_class(name, autojump_clock):
    """An error the provider answered — as an HTTP status, or inside its 200 stream, before or
    after chunks — reaches the OpenAI SDK with the provider's status class (a rate limit stays a
    rate limit, a 400 a 400), and the job's story records it as a failed attempt, never `ok`:
    final, or rate limited, or as its `outcome` says (a context overflow, a model loading)."""
    want = EXPECTED[name]
    error = want["error"]
    async with open_sidecar(lane_of(name)) as (url, fakes):
        fakes[name.split("/")[0]].script("corpus-model", replay(transcript(name)))
        client = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)
        streamed = want.get("stream", False)
        if want.get("mid_stream"):
            raw = await client.chat.completions.with_raw_response.create(
                model="auto", messages=MESSAGES, stream=True
            )
            request_id = raw.headers["x-lanes-request-id"]
            with pytest.raises(openai.APIError) as caught:
                async for _ in raw.parse():
                    pass
            assert caught.value.type == error["type"]
            if error["code"]:
                assert caught.value.code == error["code"]
        else:
            with pytest.raises(openai.APIStatusError) as refused:
                await client.chat.completions.create(
                    model="auto", messages=MESSAGES, stream=streamed
                )
            status = refused.value.status_code
            assert status // 100 == (want.get("status") or error["status"]) // 100
            assert (status == 429) == (error["type"] == "rate_limit_error")
            assert refused.value.type == error["type"]
            request_id = refused.value.response.headers["x-lanes-request-id"]
        told = await story(url, request_id)
    outcomes = [a["outcome"] for a in told["attempt_list"]]
    assert "ok" not in outcomes and told["outcome"] != "ok"
    limited = "rate_limited" if error["type"] == "rate_limit_error" else "final"
    assert outcomes[0] == want.get("outcome", limited)


def recorded_headers(name: str) -> dict[str, str]:
    head = transcript(name).partition(b"\n\n")[0].decode().split("\n")[1:]
    return dict(line.split(": ", 1) for line in head)


WITH_LIMITS = sorted(
    name for name in EXPECTED if any(k.startswith("x-ratelimit") for k in recorded_headers(name))
)


@pytest.mark.parametrize("name", WITH_LIMITS)
async def test_rate_limit_headers_reach_the_free_tier_manager(name):
    """The rate-limit headers a transcript carries are read by the lane's own conventions: the
    FreeTierManager reports the remaining requests and tokens they say."""
    headers = recorded_headers(name)
    remaining = {
        dim: next(
            int(v) for k, v in headers.items() if re.match(rf"x-ratelimit-remaining-{dim}", k)
        )
        for dim in ("requests", "tokens")
    }
    async with open_sidecar(lane_of(name)) as (url, fakes):
        fakes[name.split("/")[0]].script("corpus-model", replay(transcript(name)))
        await chat(url, name)
        async with httpx2.AsyncClient(trust_env=False) as http:
            model = (await http.get(f"{url}/lanes")).json()["lanes"][0]["models"][0]
    assert (model["requests_remaining"], model["tokens_remaining"]) == (
        remaining["requests"],
        remaining["tokens"],
    )


def test_every_transcript_is_expected_and_sourced():
    """Each file of the corpus has its expected reading and a line in SOURCES.md naming where it
    came from; every provider a lane module ships is in SOURCES.md, recorded or not."""
    files = sorted(str(p.relative_to(CORPUS)) for p in CORPUS.rglob("*.http"))
    sources = (CORPUS / "SOURCES.md").read_text()
    assert files == sorted(EXPECTED)
    assert [f for f in files if f"`{f}`" not in sources] == []
    shipped = {
        p.stem for p in (CORPUS.parent.parent / "lanes").glob("*.py") if not p.stem.startswith("_")
    } - {"openai_compatible"}
    assert [p for p in sorted(shipped) if f"### {p}" not in sources] == []

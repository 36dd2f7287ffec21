"""What lanes makes of a real llama.cpp `llama-server`, from its recorded bytes
(`tests/corpus/llamacpp`, made by `record.py` there): through `lanes serve` on loopback, a fake
replaying each answer verbatim in front of the `llamacpp` lane module. A prompt past its context
goes to a lane with a larger one, or comes back a 400 saying so in the client's dialect. (Its
plain and streamed answers and tool calls are relayed by `tests/test_corpus.py`.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import httpx2
import openai
import pytest
from trio.testing import MockClock

from lanes.testing import ANSWER, open_fake, replay
from sidecar import open_sidecar

RECORDED = Path(__file__).parent / "corpus" / "llamacpp"
MODEL = "tiny-random"  # what the recorded server called its model (`--alias`)
STREAM = (RECORDED / "text.stream.http").read_bytes()
TOO_LONG = replay((RECORDED / "context.error.http").read_bytes())
ASK: list[Any] = [{"role": "user", "content": "Say hello."}]
#: Under the autojump clock, trio's time jumps only once everything has waited this long in real
#: time while a request is in flight: the sidecar waits on worker threads, and a jump then could
#: take time past an attempt's timeout.
STEADY_S = 0.25


@pytest.fixture
def clock(autojump_clock: MockClock) -> MockClock:
    """The autojump clock, jumping only after `STEADY_S` of real time with nothing to do."""
    autojump_clock.autojump_threshold = STEADY_S
    return autojump_clock


def llamacpp(**extra: Any) -> tuple[Any, ...]:
    """The llama.cpp lane, its own module, serving the recorded model."""
    return ("llamacpp", "local", [MODEL], {"module": "llamacpp", **extra})


def larger() -> tuple[Any, ...]:
    """A second local lane, with a larger context (owned: FREE_LANE=off leaves it on)."""
    return ("larger", "local", ["larger-model"])


def chat_client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)


def messages_client(url: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=url[:-3], api_key="unused", max_retries=0)


async def chat(url: str, *, stream: bool = False) -> tuple[str, str]:
    """(the lane that answered, the text) for one chat completion asked as the OpenAI SDK does."""
    completions = chat_client(url).chat.completions.with_raw_response
    if stream:
        streamed = await completions.create(model="auto", messages=ASK, stream=True)
        chunks = [c async for c in streamed.parse()]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return streamed.headers["x-lanes-lane"], text
    raw = await completions.create(model="auto", messages=ASK)
    return raw.headers["x-lanes-lane"], raw.parse().choices[0].message.content or ""


async def message(url: str) -> tuple[str, str]:
    """(the lane that answered, the text) for one message asked as the Anthropic SDK does."""
    raw = await messages_client(url).messages.with_raw_response.create(
        model="auto", max_tokens=64, messages=ASK
    )
    reply = await raw.parse()
    return raw.headers["x-lanes-lane"], "".join(b.text for b in reply.content if b.type == "text")


async def test_a_recorded_stream_is_replayed_event_by_event(clock):
    """llama-server names its headers `Content-Type` (not `content-type`): its recorded stream
    still goes out as a chunked body, one event a piece — not as one body with a length."""
    async with open_fake("llamacpp", models=(MODEL,)) as fake:
        fake.script(MODEL, replay(STREAM))
        async with httpx2.AsyncClient(trust_env=False) as http:
            body = {"model": MODEL, "messages": ASK, "stream": True}
            got = await http.post(f"{fake.base_url}/chat/completions", json=body)
    assert got.headers["transfer-encoding"] == "chunked" and "content-length" not in got.headers
    assert got.content == STREAM.partition(b"\n\n")[2]


@pytest.mark.parametrize("door", ["chat", "chat-stream", "messages"])
async def test_a_context_overflow_goes_to_the_larger_lane(door, clock):
    """llama-server's recorded 400 `exceed_context_size_error` (a streamed request got the same
    bytes) moves the job to the lane with the larger context, which answers it — through chat
    completions, streamed or not, and through the Messages door."""
    async with open_sidecar(llamacpp(), larger()) as (url, fakes):
        fakes["llamacpp"].script(MODEL, TOO_LONG)
        if door == "messages":
            lane, text = await message(url)
        else:
            lane, text = await chat(url, stream=door == "chat-stream")
    assert (lane, text) == ("larger", ANSWER)
    assert len(fakes["llamacpp"].requests()) == len(fakes["larger"].requests()) == 1


@pytest.mark.parametrize("stream", [False, True])
async def test_a_context_overflow_with_no_larger_lane_is_a_400_saying_so(stream, clock):
    """With no lane to move to, the OpenAI SDK gets a 400 `invalid_request_error`, code
    `context_length_exceeded` (OpenAI's own), whose message says the prompt is too long and
    quotes the server's numbers."""
    async with open_sidecar(llamacpp()) as (url, fakes):
        fakes["llamacpp"].script(MODEL, TOO_LONG)
        with pytest.raises(openai.BadRequestError) as refused:
            await chat(url, stream=stream)
    error = refused.value
    assert (error.status_code, error.type, error.code) == (
        400,
        "invalid_request_error",
        "context_length_exceeded",
    )
    said = error.body["message"] if isinstance(error.body, dict) else ""
    assert said.startswith("prompt is too long: ") and "request (3493 tokens) exceeds" in said


async def test_a_context_overflow_with_no_larger_lane_is_a_messages_400_saying_so(clock):
    """Through the Messages door, the Anthropic SDK gets the Messages API's own 400 for it:
    `invalid_request_error`, its message beginning "prompt is too long" (the Messages API's words,
    which Claude Code reads as its cue to compact), then the server's numbers."""
    async with open_sidecar(llamacpp()) as (url, fakes):
        fakes["llamacpp"].script(MODEL, TOO_LONG)
        with pytest.raises(anthropic.BadRequestError) as refused:
            await message(url)
    body = refused.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    said = body["error"]["message"]
    assert said.startswith("prompt is too long: ") and "request (3493 tokens) exceeds" in said

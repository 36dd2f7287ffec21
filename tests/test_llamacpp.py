"""What lanes makes of a real llama.cpp `llama-server`, from its recorded bytes
(`tests/corpus/llamacpp`, made by `record.py` there): through `lanes serve` on loopback, a fake
replaying each answer verbatim in front of the `llamacpp` lane module. A prompt past its context
goes to a lane with a larger one, or comes back a 400 saying so in the client's dialect; a server
still loading its model is no fault, the fallback serves meanwhile, and the local lane serves again
within seconds of the load's end — whether its model list was had before the load or not. (Its
plain and streamed answers and tool calls are relayed by `tests/test_corpus.py`.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import httpx2
import openai
import pytest
import trio
from trio.testing import MockClock

from lanes.testing import ANSWER, open_fake, replay
from sidecar import open_sidecar

RECORDED = Path(__file__).parent / "corpus" / "llamacpp"
MODEL = "tiny-random"  # what the recorded server called its model (`--alias`)
LOADING = replay((RECORDED / "loading.error.http").read_bytes())
LOADING_MODELS = replay((RECORDED / "loading-models.error.http").read_bytes())
MODELS = replay((RECORDED / "models.json.http").read_bytes())
TEXT = replay((RECORDED / "text.json.http").read_bytes())
STREAM = (RECORDED / "text.stream.http").read_bytes()
TOO_LONG = replay((RECORDED / "context.error.http").read_bytes())
SAID = "Hello from a tiny random llama."  # what the recorded answer says
ASK: list[Any] = [{"role": "user", "content": "Say hello."}]
#: Under the autojump clock, trio's time jumps only once everything has waited this long in real
#: time while a request is in flight: the sidecar waits on worker threads, and a jump then could
#: take time past an attempt's timeout. While the test sleeps it jumps at once (`let_pass`): the
#: sleep's own end is as far as it can go.
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


async def lanes_state(url: str) -> dict[str, Any]:
    async with httpx2.AsyncClient(trust_env=False) as http:
        lanes = (await http.get(f"{url}/lanes")).json()["lanes"]
    return {lane["name"]: lane for lane in lanes}


async def let_pass(clock: MockClock, seconds: float) -> None:
    """Sleep `seconds` of trio's time, jumping at once; then back to `STEADY_S`."""
    clock.autojump_threshold = 0
    try:
        await trio.sleep(seconds)
    finally:
        clock.autojump_threshold = STEADY_S


async def served_by(url: str, clock: MockClock, *, seconds: int) -> list[tuple[float, str]]:
    """One chat completion a second for `seconds` (trio's clock): when each was asked, and the
    lane that answered it (each with the recorded answer's text, or the fake's)."""
    seen = []
    for _ in range(seconds):
        asked_at = trio.current_time()
        lane, text = await chat(url)
        assert text == (SAID if lane == "llamacpp" else ANSWER)
        seen.append((asked_at, lane))
        await let_pass(clock, 1)
    return seen


async def test_a_restart_while_serving_falls_back_and_returns(clock):
    """llama-server restarted (its model known): through 12 s of its recorded "Loading model"
    503s every request tries it and is served by the fallback; its breakers stay closed (two
    faults would open them); the first request after the load's end is its own again."""
    breaker = {"failures": 2, "cooldown_s": 60, "jitter": 0}
    async with open_sidecar(llamacpp(breaker=breaker), larger()) as (url, fakes):
        server = fakes["llamacpp"]
        server.script(MODEL, TEXT)
        assert [lane for _, lane in await served_by(url, clock, seconds=1)] == ["llamacpp"]
        server.script(MODEL, LOADING)  # the restart
        loading_at = trio.current_time()
        during = await served_by(url, clock, seconds=12)
        server.script(MODEL, TEXT)  # loaded
        loaded_at = trio.current_time()
        asked_during = len(server.requests()) - 1
        after = await served_by(url, clock, seconds=4)
        state = await lanes_state(url)
    assert {lane for _, lane in during} == {"larger"} and loaded_at - loading_at >= 12
    assert after[0][1] == "llamacpp", after  # the first request after the load
    model = state["llamacpp"]["models"][0]
    assert state["llamacpp"]["breaker"]["state"] == model["breaker"]["state"] == "closed"
    assert model["breaker"]["consecutive_faults"] == 0 and asked_during == len(during)


async def test_a_sidecar_started_during_the_load_finds_the_model_once_loaded(clock):
    """The sidecar starts while llama-server loads (systemd starts both): the model list it asks
    for at startup is a 503 "Loading model" too, as recorded, so the lane has no model and the
    fallback serves; the list is asked again every 2 s while the server says it is loading, so
    within seconds of the load's end the local lane serves — not after `catalog_refresh_s`
    (six hours by default), as it did."""

    def loading(fakes: dict[str, Any]) -> None:
        fakes["llamacpp"].script(MODEL, LOADING)
        fakes["llamacpp"].script_catalog(LOADING_MODELS)

    lane = llamacpp(discover=True, models=[])
    async with open_sidecar(lane, larger(), setup=loading) as (url, fakes):
        server, started = fakes["llamacpp"], trio.current_time()
        asked_before = server.catalog_requests  # its startup may take a while of trio's time
        during = await served_by(url, clock, seconds=12)
        server.script(MODEL, TEXT)  # loaded
        server.script_catalog(MODELS)
        loaded_at = trio.current_time()
        after = await served_by(url, clock, seconds=6)
        asked = server.catalog_requests - asked_before
        took = trio.current_time() - started
    assert {lane for _, lane in during} == {"larger"}
    back = next((at for at, lane in after if lane == "llamacpp"), None)
    assert back is not None and back - loaded_at <= 4.0, after
    assert server.requests()[0].at >= loaded_at  # no model to ask for until it was listed
    assert 6 <= asked <= took / 2 + 2  # every 2 s through the load (not more), then it serves

"""Streaming through the dispatcher over real loopback sockets, on virtual time."""

from __future__ import annotations

import pytest
import trio

import lanes
from helpers import config, local_lane, paid_lane
from lanes.testing import (
    ANSWER,
    answer,
    garbage,
    hang,
    malformed_chunk,
    no_done,
    open_fake,
    status,
    stream_cut,
    stream_stall,
)

MESSAGES = [{"role": "user", "content": "Say the pangram."}]


def job(**kw) -> lanes.Job:
    return lanes.Job(messages=MESSAGES, **kw)


@pytest.fixture
async def pair():
    async with (
        open_fake("local", models=("local-model",)) as local,
        open_fake("paid", models=("paid-model",)) as paid,
    ):
        yield local, paid


def cfg(local, paid, **local_extra):
    return config(
        local_lane("local", local.base_url, **local_extra), paid_lane("paid", paid.base_url)
    )


async def collect(dispatcher, j):
    async with dispatcher.open_stream(j) as stream:
        chunks = [chunk async for chunk in stream]
    return stream, chunks


async def test_healthy_stream_delivers_every_chunk(pair, env, autojump_clock):
    """A healthy stream arrives whole: role, words, finish reason; the text is the known answer."""
    local, paid = pair
    async with lanes.open_dispatcher(cfg(local, paid), env=env) as dispatcher:
        stream, chunks = await collect(dispatcher, job())
    assert stream.lane == "local" and stream.route == "local"
    assert stream.delivered_text == ANSWER and stream.finish_reason == "stop"
    assert chunks[0]["object"] == "chat.completion.chunk"
    assert [a.outcome for a in stream.attempts] == ["ok"]


@pytest.mark.parametrize(
    ("fault", "tries"),
    [
        pytest.param(hang(), 1, id="hung"),
        pytest.param(status(503), 2, id="503"),
        pytest.param(garbage(), 2, id="garbage"),
        pytest.param(stream_cut(after=0), 2, id="cut-before-first-chunk"),
        pytest.param(answer(delay_s=5), 1, id="slow-first-token"),
    ],
)
async def test_stream_falls_back_before_the_first_chunk(fault, tries, pair, env, autojump_clock):
    """Any failure before the first chunk reaches the caller falls back to the next lane freely
    (a transient fault is retried once first; a silent lane is not tried again)."""
    local, paid = pair
    local.script("local-model", fault)
    async with lanes.open_dispatcher(cfg(local, paid, first_token_s=2), env=env) as dispatcher:
        start = trio.current_time()
        stream, chunks = await collect(dispatcher, job(deadline_s=10))
        assert trio.current_time() - start <= 2 + 1e-6
    assert stream.lane == "paid" and stream.delivered_text == ANSWER
    assert [a.outcome for a in stream.attempts] == ["fault"] * tries + ["ok"]


@pytest.mark.parametrize(
    "fault", [stream_cut(after=3), stream_cut(after=3, clean=True)], ids=["dropped", "ended"]
)
async def test_cut_stream_after_chunks_is_never_a_clean_end(fault, pair, env, autojump_clock):
    """A stream cut after chunks were delivered raises StreamInterrupted; it never ends quietly."""
    local, paid = pair
    local.script("local-model", fault)
    async with lanes.open_dispatcher(cfg(local, paid), env=env) as dispatcher:
        received = []
        with pytest.raises(lanes.StreamInterrupted):
            async with dispatcher.open_stream(job()) as stream:
                async for chunk in stream:
                    received.append(chunk)
    assert 0 < len(received) < 10
    assert stream.delivered_text != ANSWER
    assert stream.attempts[-1].outcome == "fault"


async def test_stalled_stream_is_cut_at_the_idle_limit(pair, env, autojump_clock):
    """No bytes for idle_s after chunks: StreamInterrupted at exactly that moment."""
    local, paid = pair
    local.script("local-model", stream_stall(after=2))
    async with lanes.open_dispatcher(cfg(local, paid, idle_s=4), env=env) as dispatcher:
        start = trio.current_time()
        with pytest.raises(lanes.StreamInterrupted, match="stalled"):
            await collect(dispatcher, job(deadline_s=30))
        assert trio.current_time() - start == pytest.approx(4)


async def test_stream_deadline_mid_stream(pair, env, autojump_clock):
    """A slow stream that outlives the job's deadline is interrupted at the deadline."""
    local, paid = pair
    local.script("local-model", answer(chunk_delay_s=1))
    async with lanes.open_dispatcher(cfg(local, paid), env=env) as dispatcher:
        start = trio.current_time()
        with pytest.raises(lanes.StreamInterrupted, match="deadline"):
            await collect(dispatcher, job(deadline_s=3.5))
        assert trio.current_time() - start == pytest.approx(3.5)


async def test_malformed_chunk_is_skipped(pair, env, autojump_clock):
    """One non-JSON event is skipped and counted; the answer still arrives whole."""
    local, paid = pair
    local.script("local-model", malformed_chunk(after=2))
    async with lanes.open_dispatcher(cfg(local, paid), env=env) as dispatcher:
        stream, _ = await collect(dispatcher, job())
    assert stream.delivered_text == ANSWER and stream.malformed_chunks == 1


async def test_stream_without_done_is_finalised(pair, env, autojump_clock):
    """A stream that ends after its finish reason but without [DONE] completes normally."""
    local, paid = pair
    local.script("local-model", no_done())
    async with lanes.open_dispatcher(cfg(local, paid), env=env) as dispatcher:
        stream, _ = await collect(dispatcher, job())
    assert stream.delivered_text == ANSWER and stream.finish_reason == "stop"
    assert [a.outcome for a in stream.attempts] == ["ok"]


async def test_usage_is_reported_when_asked(pair, env, autojump_clock):
    """With stream_options.include_usage the final usage chunk is passed on and costed."""
    local, paid = pair
    async with lanes.open_dispatcher(
        config(paid_lane("paid", paid.base_url)), env=env
    ) as dispatcher:
        stream, chunks = await collect(
            dispatcher, job(params={"stream_options": {"include_usage": True}})
        )
    assert chunks[-1]["usage"]["total_tokens"] > 0
    assert stream.cost_usd > 0


async def test_abandoned_stream_counts_against_nobody(pair, env, autojump_clock):
    """A caller that stops reading early releases the attempt; the breaker stays clean."""
    local, paid = pair
    local.script("local-model", answer(chunk_delay_s=1))
    async with lanes.open_dispatcher(cfg(local, paid), env=env) as dispatcher:
        async with dispatcher.open_stream(job()) as stream:
            await stream.__anext__()
        stats = dispatcher.statistics().model("local/local-model").breaker
    assert stream.attempts[-1].outcome == "abandoned"
    assert stats.consecutive_faults == 0 and not stats.probe_in_flight

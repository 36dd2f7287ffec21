"""Review of the money path after issues 27 and 28: usage an upstream can send that settles below
what it could bill, found by trying to break it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import lanes
from helpers import config, paid_lane
from lanes._core.upstream.shapes import running_usage
from lanes.freetier.prices import settled_usd
from lanes.testing import open_fake, raw

MESSAGES = [{"role": "user", "content": "What does this cost?"}]
IN, OUT = 1.0, 2.0  # the paid fake's prices, USD per million tokens (see helpers.paid_lane)
SSE = {"content-type": "text/event-stream"}


def chunk(delta: dict[str, Any], finish: str | None = None, **top: Any) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return {"id": "c1", "object": "chat.completion.chunk", "model": "m", "choices": [choice], **top}


def stream_of(*chunks: dict[str, Any]) -> Any:
    data = [f"data: {json.dumps(c)}\n\n".encode() for c in chunks] + [b"data: [DONE]\n\n"]
    return raw(headers=SSE, chunks=lambda: data)


async def test_a_stream_whose_usage_falls_is_not_settled_at_the_lower_figure(env, autojump_clock):
    """A stream that reports a running usage (1000 in, 500 out) and then a smaller one (0, 0) on
    its last chunk settles at no less than the larger: usage that goes down is no proof."""
    big = {"prompt_tokens": 1000, "completion_tokens": 500, "total_tokens": 1500}
    small = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    script = stream_of(
        chunk({"role": "assistant", "content": "a"}, usage=big),
        chunk({}, "stop", usage=small),
    )
    job = lanes.Job(messages=MESSAGES, model="paid/paid-model", params={"max_tokens": 600})
    async with (
        open_fake("paid", models=("paid-model",)) as paid,
        lanes.open_dispatcher(config(paid_lane("paid", paid.base_url)), env=env) as d,
    ):
        paid.script("paid-model", script)
        async with d.open_stream(job) as stream:
            _ = [c async for c in stream]
        spent = d.paid_spent_today()
    assert spent >= (1000 * IN + 500 * OUT) / 1e6 - 1e-12


counts = st.integers(0, 10**6)
usages = st.fixed_dictionaries(
    {"prompt_tokens": counts, "completion_tokens": counts, "total_tokens": counts}
)


@given(st.lists(usages, min_size=1, max_size=6))
def test_a_running_usage_never_falls(reports):
    """However a stream's usage reports go up and down, what it has reported once they are all in
    holds each count at no less than the largest any report gave."""
    kept = None
    for report in reports:
        kept = running_usage(kept, report)
    assert kept is not None
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert kept[key] == max(r[key] for r in reports)


@pytest.mark.parametrize("total", [20, None], ids=["total", "no total"])
def test_reasoning_tokens_the_usage_does_not_account_for_are_not_believed(total):
    """Usage whose `reasoning_tokens` fit in neither its completion (OpenAI: inside it) nor the
    total's excess over its parts (xAI, Gemini: beside it) does not add up: it settles at the
    reservation, not at the 10 tokens it admits to."""
    usage = {
        "prompt_tokens": 10,
        "completion_tokens": 10,
        "total_tokens": total,
        "completion_tokens_details": {"reasoning_tokens": 5000},
    }
    assert settled_usd(usage, IN, OUT, reserved_usd=0.5) == (0.5, False)


def test_reasoning_tokens_beside_the_completion_and_in_the_total_are_believed():
    """xAI's shape (reasoning outside `completion_tokens`, inside `total_tokens`) adds up and is
    billed in full: prompt at the input price, completion and the reasoning excess at output."""
    usage = {
        "prompt_tokens": 32,
        "completion_tokens": 9,
        "total_tokens": 135,
        "completion_tokens_details": {"reasoning_tokens": 94},
    }
    cost, believed = settled_usd(usage, IN, OUT, reserved_usd=0.5)
    assert believed and cost == pytest.approx((32 * IN + 103 * OUT) / 1e6)

"""Usage from an upstream is believed only when it is sane and adds up; else the attempt settles at
its reservation — and the ledger is never below what an upstream honouring the caps could bill."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import lanes
from helpers import config, http_client, paid_lane, spent
from lanes._core.freetier.prices import settled_usd, usage_cost, usage_tokens, usage_total
from lanes._core.model.candidates import Candidate
from lanes._core.policy.spend import paid_request, worst_case
from lanes._core.upstream.shapes import running_usage
from lanes.testing import answer, open_fake, raw
from sidecar import open_sidecar

MESSAGES = [{"role": "user", "content": "What does this cost?"}]
PAID = ("paid", "paid", ["paid-model"])
IN = 1.0  # the paid fakes' input price, USD per million tokens (lanes.harness.configs)


def _ten_and_ten(total: Any) -> dict[str, Any]:
    return {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": total}


@pytest.mark.parametrize(
    "usage",
    [
        pytest.param(_ten_and_ten(2**64), id="2^64"),
        pytest.param(_ten_and_ten(1e300), id="1e300"),
        pytest.param(_ten_and_ten(5), id="below"),
        pytest.param(_ten_and_ten(20.0), id="float"),
        pytest.param(_ten_and_ten("20"), id="text"),
        pytest.param(_ten_and_ten(-1), id="negative"),
    ],
)
def test_a_total_that_does_not_add_up_is_not_usage(usage):
    """A total that is no count (2^64, 1e300, a float, text, negative) or falls short of its parts
    makes the usage unbelievable: it settles at the reservation, not from the parts (the quota
    windows still count the parts)."""
    assert usage_tokens(usage) is None and usage_cost(usage, 1.0, 2.0) is None
    assert settled_usd(usage, 1.0, 2.0, reserved_usd=0.5) == (0.5, False)
    assert usage_total(usage) == 20  # the free-tier windows count the most it could mean


@pytest.mark.parametrize(
    ("usage", "tokens"),
    [
        pytest.param(  # OpenAI: reasoning inside completion_tokens, total their sum
            {
                "prompt_tokens": 19,
                "completion_tokens": 74,
                "total_tokens": 93,
                "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": 64, "audio_tokens": 0},
            },
            (19, 74),
            id="openai-reasoning",
        ),
        pytest.param(  # Gemini's OpenAI-compatible answer: thoughts counted in the total only
            {"prompt_tokens": 20, "completion_tokens": 424, "total_tokens": 1016},
            (20, 996),
            id="gemini-thoughts",
        ),
        pytest.param(  # a proxy that names the reasoning but leaves it out of completion_tokens
            {
                "prompt_tokens": 21,
                "completion_tokens": 0,
                "total_tokens": 81,
                "completion_tokens_details": {"reasoning_tokens": 60},
            },
            (21, 60),
            id="reasoning-outside",
        ),
        pytest.param(  # time figures beside the counts (some fast providers add them)
            {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17, "total_time": 0.02},
            (12, 5),
            id="with-times",
        ),
        pytest.param({"prompt_tokens": 12, "completion_tokens": 5}, (12, 5), id="no-total"),
        pytest.param(
            {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": None}, (12, 5), id="null"
        ),
        pytest.param(  # rounding: a total a token short of its parts
            {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 16}, (12, 5), id="round"
        ),
        pytest.param({"prompt_tokens": 7, "total_tokens": 7}, (7, 0), id="embedding"),
    ],
)
def test_honest_usage_from_real_providers_is_believed(usage, tokens):
    """The usage shapes real providers send are believed: the settlement is their own figures."""
    assert usage_tokens(usage) == tokens
    cost, believed = settled_usd(usage, 1.0, 2.0, reserved_usd=1.0)
    assert believed and cost == pytest.approx((tokens[0] * 1.0 + tokens[1] * 2.0) / 1e6)


def test_a_totals_excess_over_its_parts_is_billed_at_the_dearer_price():
    """The usage does not say whether a total's excess is input (a tool prompt, cache) or output
    (reasoning): it is billed at whichever price is higher."""
    usage = {"prompt_tokens": 4, "completion_tokens": 10, "total_tokens": 407}
    assert usage_cost(usage, 3.0, 2.0) == pytest.approx((4 * 3.0 + 10 * 2.0 + 393 * 3.0) / 1e6)


# -- the property: the ledger is never below what an honest upstream could bill -------------------

counts: st.SearchStrategy[Any] = st.one_of(
    st.integers(0, 10**6),
    st.integers(0, 10**6),
    st.integers(-(2**70), 2**70),
    st.sampled_from([2**64, 10**8, 10**8 + 1, 1e300, -1, 0.5, 20.0, True, None, "12", [], {}]),
    st.floats(allow_nan=False),
)
usages = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "prompt_tokens": counts,
            "completion_tokens": counts,
            "total_tokens": counts,
            "completion_tokens_details": st.fixed_dictionaries({"reasoning_tokens": counts}),
        },
    ),
    st.tuples(st.integers(0, 10**5), st.integers(0, 10**5), st.integers(-50, 10**6)).map(
        lambda t: {"prompt_tokens": t[0], "completion_tokens": t[1], "total_tokens": sum(t)}
    ),
    st.sampled_from([None, "lots", 7, [1, 2]]),
)


def _number(value: Any) -> float | None:
    """A figure the usage gives, read as generously as an upstream might mean it."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        number = float(value)
    except (ValueError, OverflowError):
        return math.inf if isinstance(value, int) else None
    return number if number >= 0 else None


def readings(usage: Any, price_in: float, price_out: float) -> list[float]:
    """What an upstream reporting `usage` may mean it billed (USD), written apart from the code
    under test: its parts at their prices, or its total at the cheaper price."""
    if not isinstance(usage, dict):
        return []
    prompt, completion, total = (
        _number(usage.get(key)) for key in ("prompt_tokens", "completion_tokens", "total_tokens")
    )
    found = []
    if prompt is not None and completion is not None:
        found.append((prompt * price_in + completion * price_out) / 1e6)
    if total is not None:
        found.append(total * min(price_in, price_out) / 1e6)
    return found


@given(
    usage=usages,
    price_in=st.floats(0.01, 100),
    price_out=st.floats(0.01, 100),
    prompt=st.text(max_size=200),
    cap=st.integers(1, 100_000),
)
def test_the_ledger_is_never_below_what_an_honest_upstream_could_bill(
    usage, price_in, price_out, prompt, cap
):
    """For any usage an upstream sends, an answered paid attempt settles at no less than what an
    upstream honouring the request's cap could bill while reporting it: the least of the
    reservation and the most the usage may mean; and usage not believed settles at exactly the
    reservation."""
    candidate = Candidate(
        lane="p", model="m", tier="paid", input_usd_per_mtok=price_in, output_usd_per_mtok=price_out
    )
    job = lanes.Job(messages=[{"role": "user", "content": prompt or "x"}], params={})
    sent = paid_request(job, cap_param="max_tokens", paid_max_tokens=cap)
    reserved = worst_case(candidate, sent)
    assert isinstance(reserved, float)
    settled, believed = settled_usd(usage, price_in, price_out, reserved_usd=reserved)
    could_bill = min([reserved, max(readings(usage, price_in, price_out), default=reserved)])
    assert settled >= could_bill * (1 - 1e-9), (settled, could_bill)
    if not believed:
        assert settled == reserved


async def test_usage_whose_total_exceeds_its_parts_is_not_believed():
    """Some providers bill reasoning (or audio, cache) tokens outside `completion_tokens` and count
    them in `total_tokens` only. Usage whose total is 2,000× its parts is not sane: it must settle
    at no less than its total at the input price (the reservation), not at 2 tokens."""
    usage = {
        "prompt_tokens": 1,
        "completion_tokens": 1,
        "total_tokens": 4000,
        "completion_tokens_details": {"reasoning_tokens": 3998},
    }
    async with open_sidecar(PAID, policy={"free_tier_fallback": "allow"}) as (url, fakes):
        fakes["paid"].script("paid-model", answer(usage=usage))
        async with http_client() as http:
            response = await http.post(f"{url}/chat/completions", json={"messages": MESSAGES})
            ledger = await spent(http, url)
    assert response.status_code == 200
    assert ledger >= 4000 * IN / 1e6, ledger


# A stream's usage that falls, and reasoning tokens the usage does not account for: usage an
# upstream can send that would settle below what it could bill.

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

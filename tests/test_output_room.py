"""A client's output cap is a ceiling: a model that holds less of it still serves, sent the cap
it holds; one that holds too little is left out with a reason; models that hold the whole cap go
first; on a paid attempt the lowered cap only lowers the worst case."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from lanes import Job
from lanes._core.model.candidates import Candidate
from lanes._core.policy.needs import estimate_tokens, needs_of
from lanes._core.policy.policy import PolicyConfig, make_plan, unfit
from lanes._core.policy.room import MIN_CLAMPED_OUTPUT
from lanes._core.policy.spend import as_sent, worst_case

INPUT = "x" * 4000  # about 1,000 tokens of input


def job(max_tokens: int | None, **params: Any) -> Job:
    if max_tokens is not None:
        params["max_tokens"] = max_tokens
    return Job(messages=[{"role": "user", "content": INPUT}], params=params)


def model(name: str, tier: str = "free", **kw: Any) -> Candidate:
    prices = {"input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0} if tier == "paid" else {}
    return Candidate(lane="l", model=name, tier=tier, **prices, **kw)  # type: ignore[arg-type]


def sent_cap(j: Job, c: Candidate, *, paid_max_tokens: int = 10**6) -> Any:
    capped = c.tier == "paid"
    return as_sent(j, c, paid_max_tokens=paid_max_tokens, capped=capped).body(c.model)["max_tokens"]


def test_a_model_that_holds_part_of_the_cap_serves_it_lowered():
    """A cap of 65,000 on a 65,536-context model: fit, and sent what the context leaves."""
    j, c = job(65_000), model("m", context=65_536)
    assert unfit(c, needs_of(j), "any") is None
    assert sent_cap(j, c) == 65_536 - estimate_tokens(j)


def test_a_declared_output_limit_lowers_the_cap():
    """A model that writes at most 32,768 tokens is sent 32,768, whatever its context."""
    assert sent_cap(job(64_000), model("m", context=131_072, max_output_tokens=32_768)) == 32_768


def test_a_cap_that_fits_is_sent_as_asked():
    """A cap the model holds whole is sent untouched."""
    assert sent_cap(job(2_000), model("m", context=65_536, max_output_tokens=8_192)) == 2_000


def test_a_model_that_holds_too_little_is_left_out_with_a_reason():
    """Less room than MIN_CLAMPED_OUTPUT of the cap (or than a smaller cap asked): unfit."""
    small = model("m", context=1_000 + MIN_CLAMPED_OUTPUT)  # the input leaves < 4,096
    assert unfit(small, needs_of(job(64_000)), "any") == (
        f"context {small.context} < ~{estimate_tokens(job(64_000)) + MIN_CLAMPED_OUTPUT} "
        "tokens needed"
    )
    assert unfit(model("m", max_output_tokens=1_024), needs_of(job(64_000)), "any") == (
        f"writes at most 1024 tokens < {MIN_CLAMPED_OUTPUT} asked"
    )
    tight = model("m", context=estimate_tokens(job(500)) + 499)
    assert unfit(tight, needs_of(job(500)), "any") is not None  # a small cap is held whole


def test_within_a_tier_the_models_that_hold_the_whole_cap_go_first():
    """Of two free models, the one that would cut the answer is tried after the roomy one."""
    candidates = [model("cut", context=65_536), model("roomy", context=1_048_576)]
    plan = make_plan(job(65_000), candidates, PolicyConfig())
    assert [c.model for c in plan.candidates] == ["roomy", "cut"]
    local = [model("cut-local", tier="local", context=65_536), *candidates]
    plan = make_plan(job(65_000), local, PolicyConfig())
    assert [c.model for c in plan.candidates][0] == "cut-local"  # tiers still come first


@given(
    asked=st.integers(1, 200_000),
    context=st.none() | st.integers(2_000, 2_000_000),
    limit=st.none() | st.integers(1, 200_000),
    paid_max=st.integers(1, 100_000),
)
def test_a_paid_cap_is_never_above_the_asked_nor_the_room_and_the_worst_case_follows(
    asked, context, limit, paid_max
):
    """On a paid attempt the cap sent is min(asked, room, paid_max_tokens) — never more than
    the client asked — and the reservation prices exactly that cap."""
    j, c = job(asked), model("p", tier="paid", context=context, max_output_tokens=limit)
    rooms = (None if context is None else context - estimate_tokens(j), limit)
    expected = min([asked, paid_max, *(max(r, 1) for r in rooms if r is not None)])
    sent = as_sent(j, c, paid_max_tokens=paid_max, capped=True)
    assert sent.body("p")["max_tokens"] == expected <= asked
    roomy = model("p", tier="paid")  # no limits known: the cap is min(asked, paid_max)
    lowered = worst_case(c, sent)
    whole = worst_case(roomy, as_sent(j, roomy, paid_max_tokens=paid_max, capped=True))
    assert isinstance(lowered, float) and isinstance(whole, float) and lowered <= whole

"""The policy's pure parts: needs, classes, the plan's order and filters, worst cases, retries."""

from __future__ import annotations

import pytest

from lanes import Job
from lanes._core.model.candidates import Candidate
from lanes._core.policy.needs import needs_of
from lanes._core.policy.policy import (
    PolicyConfig,
    after_failure,
    make_plan,
    request_class,
)


def job(content="hi", **kw) -> Job:
    return Job(messages=[{"role": "user", "content": content}], **kw)


LOCAL = Candidate(lane="ollama", model="l", tier="local", context=8192)
FREE_A = Candidate(lane="groq", model="a", tier="free", context=131072, tools=True)
FREE_B = Candidate(lane="cerebras", model="b", tier="free", context=8192, tools=False, zdr=True)
PAID = Candidate(
    lane="openai",
    model="p",
    tier="paid",
    context=1_000_000,
    input_usd_per_mtok=1,
    output_usd_per_mtok=2,
)


def keys(plan):
    return [c.key for c in plan.candidates]


def test_order_is_local_then_free_then_paid():
    """Whatever the config order, owned capacity comes first and paid last."""
    plan = make_plan(job(), [PAID, FREE_A, LOCAL, FREE_B], PolicyConfig())
    assert keys(plan) == ["ollama/l", "groq/a", "cerebras/b", "openai/p"]


def test_class_preference_moves_a_free_model_up():
    """A class's preferred free model is tried first among the free ones."""
    policy = PolicyConfig(classes={"coding": ["cerebras/b"]})
    plan = make_plan(job("fix this:\n```py\nx=1\n```"), [FREE_A, FREE_B], policy)
    assert plan.request_class == "coding" and keys(plan) == ["cerebras/b", "groq/a"]


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({"params": {"tools": [{"type": "function"}]}}, "agentic"),
        ({"request_class": "reasoning"}, "reasoning"),
        ({}, "general"),
    ],
)
def test_request_class_heuristic(kw, expected):
    """Given class wins; tools → agentic; otherwise general."""
    assert request_class(job(**kw), 32000) == expected


def test_long_input_is_long_context():
    assert request_class(job("x" * 200_000), 32000) == "long_context"


def test_capability_filters_record_their_reason():
    """Tools, images and context needs remove unfit candidates, each with a reason."""
    tools = job(params={"tools": [{"type": "function"}]})
    plan = make_plan(tools, [FREE_A, FREE_B], PolicyConfig())
    assert keys(plan) == ["groq/a"] and plan.removed[0].reason == "no tool calling"
    image = Job(
        messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    )
    assert needs_of(image).images
    assert make_plan(
        image, [Candidate(lane="x", model="m", tier="free", vision=False)], PolicyConfig()
    ).removed
    big = job("y" * 80_000)
    plan = make_plan(big, [LOCAL, FREE_A], PolicyConfig())
    assert keys(plan) == ["groq/a"] and plan.removed[0].reason.startswith("context 8192 <")


@pytest.mark.parametrize(
    ("privacy", "expected"),
    [
        ("local", ["ollama/l"]),
        ("zdr", ["ollama/l", "cerebras/b"]),
        ("any", ["ollama/l", "groq/a", "cerebras/b", "openai/p"]),
    ],
)
def test_privacy(privacy, expected):
    """local: owned only; zdr: owned or zero-data-retention; any: everything."""
    assert (
        keys(make_plan(job(privacy=privacy), [LOCAL, FREE_A, FREE_B, PAID], PolicyConfig()))
        == expected
    )


def test_free_tier_only_removes_paid():
    assert keys(make_plan(job(), [FREE_A, PAID], PolicyConfig(free_tier_only=True))) == ["groq/a"]


@pytest.mark.parametrize(
    ("outcome", "kw", "expected"),
    [
        ("fault", {}, ("same", 0.0)),  # a blip is retried once
        ("fault", {"retried": True}, ("next", 0.0)),  # a second fault moves on
        ("fault", {"time_left_s": 0.5}, ("next", 0.0)),  # no time for a retry
        ("rate_limited", {"wait_s": 2.0}, ("same", 2.0)),  # short wait, only paid left: wait it out
        (
            "rate_limited",
            {"wait_s": 2.0, "alternatives_free": True},
            ("next", 0.0),
        ),  # another free one: go
        ("rate_limited", {"wait_s": 9.0}, ("next", 0.0)),  # too long to wait
        (
            "rate_limited",
            {"wait_s": 2.0, "time_left_s": 2.2},
            ("next", 0.0),
        ),  # the deadline would not allow
        ("credit_exhausted", {"wait_s": 1.0}, ("next", 0.0)),
        ("model_gone", {}, ("next", 0.0)),
    ],
)
def test_after_failure(outcome, kw, expected):
    """Retry discipline as a table."""
    args = {
        "retried": False,
        "wait_s": None,
        "time_left_s": 10.0,
        "max_wait_s": 5.0,
        "alternatives_free": False,
        **kw,
    }
    assert after_failure(outcome, **args) == expected

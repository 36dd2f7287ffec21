"""What a request may carry when money is at stake: only parameters its worst case prices on a
paid attempt, none of a lane's billing switches on a free one (review findings 1, 2 and 10)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_money import IN, MESSAGES, OUT, readable_bytes

import lanes
from helpers import config, free_lane, local_lane, paid_lane
from lanes._core.config import LaneConfig
from lanes._core.dialects import messages_api, responses_api
from lanes._core.job import Candidate
from lanes._core.routing.spend import (
    PRICED_PARAMS,
    UNDECLARED_TOOL_PROMPT_TOKENS,
    Unbounded,
    as_sent,
    billed_bytes,
    paid_request,
    unpriced,
    worst_case,
)
from lanes._core.upstream.loader import find_provider
from lanes.testing import open_fake

#: The most any provider documents adding to a request with tools (Claude 3 Opus, `auto`).
LARGEST_DOCUMENTED_TOOL_PROMPT = 530
SWITCHES = frozenset({"models", "plugins", "route"})
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}

text = st.text(st.characters(blacklist_categories=["Cs"]), max_size=30)
values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)
#: Parameter names a client may send: priced ones, known billing switches, and made-up ones.
names = st.sampled_from(
    sorted(
        {*PRICED_PARAMS, *SWITCHES, "service_tier", "web_search_options", "audio", "prediction"}
        | {"modalities", "store", "thinking", "search_parameters", "x_new_billing_switch"}
    )
) | st.from_regex(r"[a-z_]{1,12}", fullmatch=True)
extras = st.dictionaries(names, values, max_size=5)


def hidden_tokens(candidate: Candidate, body: dict[str, Any]) -> int:
    """The tool prompt an upstream may add itself: what the lane declares, else the largest any
    provider documents — written apart from the code under test."""
    if not (body.get("tools") or body.get("functions")):
        return 0
    declared = candidate.tool_prompt_tokens
    return LARGEST_DOCUMENTED_TOOL_PROMPT if declared is None else declared


def bill(candidate: Candidate, body: dict[str, Any]) -> float:
    """The most an upstream that honours the sent cap (and bills nothing unpriced) can bill."""
    n = body.get("n", 1)
    cap = body[candidate.cap_param]
    prompt = readable_bytes(
        {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    )
    return n * ((prompt + hidden_tokens(candidate, body)) * IN + cap * OUT) / 1e6


@given(
    extra=extras,
    tools=st.booleans(),
    declared=st.none() | st.integers(0, 2000),
    switches=st.sampled_from([frozenset(), SWITCHES]),
    n=st.integers(1, 8),
)
def test_a_bounded_worst_case_covers_any_bill_and_sends_only_priced_parameters(
    extra, tools, declared, switches, n
):
    """For any parameters a client adds: either the worst case is unbounded — and names one
    parameter it does not price — or every parameter sent is priced (allowlisted, in a value it
    covers, not a billing switch of the lane) and the reservation is at least what an upstream
    can bill, its own tool prompt included."""
    candidate = Candidate(
        lane="p",
        model="m",
        tier="paid",
        input_usd_per_mtok=IN,
        output_usd_per_mtok=OUT,
        billing_switches=switches,
        tool_prompt_tokens=declared,
    )
    params = {**extra, "n": n, **({"tools": [TOOL]} if tools else {})}
    sent = paid_request(
        lanes.Job(messages=MESSAGES, params=params), cap_param="max_tokens", paid_max_tokens=64
    )
    body = sent.body("m")
    reserved = worst_case(candidate, sent)
    sent_params = set(body) - {"model", "messages"}
    unpriced_sent = {
        k
        for k in sent_params
        if k not in PRICED_PARAMS or not PRICED_PARAMS[k](body[k]) or k in switches
    }
    if isinstance(reserved, Unbounded):
        named = {k for k in sent_params if repr(k) in str(reserved) or f"{k}=" in str(reserved)}
        assert unpriced_sent & named or "n must be" in str(reserved), (reserved, sent_params)
        return
    assert unpriced_sent == set(), (sent_params, reserved)
    assert reserved >= bill(candidate, body) - 1e-12


@given(extra=extras, tier=st.sampled_from(["free", "local", "paid", "byok"]))
def test_a_lanes_billing_switches_never_leave_on_an_attempt_that_is_not_paid(extra, tier):
    """A free (or local) attempt carries none of the lane's billing switches and every other
    parameter untouched; a paid one keeps them (to be refused, never silently changed); a client's
    own key (byok) sends what it was given."""
    candidate = Candidate(lane="or", model="m:free", tier=tier, billing_switches=SWITCHES)
    job = lanes.Job(messages=MESSAGES, params=extra)
    params = dict(as_sent(job, candidate, paid_max_tokens=64, capped=False).params)
    if tier in ("paid", "byok"):
        assert params == extra
    else:
        assert params == {k: v for k, v in extra.items() if k not in SWITCHES}


def test_unpriced_parameters_are_named_and_prompts_are_not_shown():
    """The reason names the parameter (and a short value checked by value), never a prompt."""
    paid = Candidate(
        lane="p",
        model="m",
        tier="paid",
        input_usd_per_mtok=IN,
        output_usd_per_mtok=OUT,
        billing_switches=frozenset({"plugins"}),
    )
    cases: dict[str, dict[str, Any]] = {
        "service_tier='priority' may bill beyond what the reservation prices": {
            "service_tier": "priority"
        },
        "parameter 'web_search_options' is not one the reservation prices": {
            "web_search_options": {}
        },
        "parameter 'prediction' is not one the reservation prices": {
            "prediction": {"type": "content", "content": "SECRET PROMPT"}
        },
        "modalities=['text', 'audio'] may bill beyond what the reservation prices": {
            "modalities": ["text", "audio"]
        },
        "lane p declares 'plugins' a billing switch no reservation prices": {
            "plugins": [{"id": "web"}]
        },
        "parameter 'tools' holds a value the reservation does not price": {
            "tools": [TOOL, {"type": "web_search_preview", "note": "SECRET PROMPT"}]
        },
    }
    for reason, params in cases.items():
        job = paid_request(
            lanes.Job(messages=MESSAGES, params=params), cap_param="max_tokens", paid_max_tokens=9
        )
        assert str(worst_case(paid, job)) == reason
    fine = {
        "service_tier": "default",
        "modalities": ["text"],
        "seed": 1,
        "user": "u",
        "tools": [TOOL],
    }
    job = paid_request(
        lanes.Job(messages=MESSAGES, params=fine), cap_param="max_tokens", paid_max_tokens=9
    )
    assert isinstance(worst_case(paid, job), float)


def test_every_dialect_translation_sends_only_priced_parameters():
    """The Responses and Messages APIs translate into chat parameters a paid attempt may carry."""
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    responses = responses_api.to_chat(
        {
            "model": "auto",
            "input": "hi",
            "instructions": "be brief",
            "temperature": 0.5,
            "top_p": 0.9,
            "user": "u",
            "max_output_tokens": 50,
            "tools": [{"type": "function", "name": "f", "parameters": schema}],
            "parallel_tool_calls": False,
            "tool_choice": "auto",
            "text": {"format": {"type": "json_schema", "name": "s", "schema": schema}},
        }
    )
    messages = messages_api.to_chat(
        {
            "model": "claude-haiku-4-5",
            "max_tokens": 50,
            "system": "be brief",
            "messages": [{"role": "user", "content": "hi"}],
            "temperature": 0.5,
            "top_p": 0.9,
            "stop_sequences": ["END"],
            "metadata": {"user_id": "u"},
            "tools": [{"name": "f", "input_schema": schema}],
            "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
        }
    )
    paid = Candidate(lane="p", model="m", tier="paid")
    for chat in (responses, messages):
        assert len(chat.params) >= 6
        assert unpriced(paid, {**chat.params, "stream_options": {}}, embedding=False) is None


def test_a_lanes_declared_tool_prompt_is_reserved_and_config_can_raise_it():
    """With tools, the worst case adds the lane's tool prompt (the Anthropic module's 346
    tokens; 1,024 when a lane declares none; what config says over both); without, nothing."""
    provider, _ = find_provider(LaneConfig(name="anthropic"))
    assert provider is not None and provider.tool_prompt_tokens == 346
    tools = lanes.Job(messages=MESSAGES, params={"tools": [TOOL], "max_tokens": 1})
    plain = lanes.Job(messages=MESSAGES, params={"max_tokens": 1})
    for declared, extra in ((None, UNDECLARED_TOOL_PROMPT_TOKENS), (346, 346), (5000, 5000)):
        c = Candidate(
            lane="p",
            model="m",
            tier="paid",
            input_usd_per_mtok=1e6,  # a dollar a token: the difference reads in tokens
            output_usd_per_mtok=0.0,
            tool_prompt_tokens=declared,
        )
        with_tools, without = worst_case(c, tools), worst_case(c, plain)
        assert isinstance(with_tools, float) and isinstance(without, float)
        tool_bytes = billed_bytes(tools.body("m")) - billed_bytes(plain.body("m"))
        assert with_tools - without == pytest.approx(extra + tool_bytes)


async def test_config_declares_billing_switches_and_a_tool_prompt_for_any_lane(env, autojump_clock):
    """`billing_switches` and `tool_prompt_tokens` in a `[[lanes]]` table reach its candidates
    beside the module's own."""
    async with open_fake("x", models=("local-model",)) as x:
        cfg = config(
            local_lane("x", x.base_url, billing_switches=["plugins"], tool_prompt_tokens=777)
        )
        async with lanes.open_dispatcher(cfg, env=env) as d:
            [candidate] = d.candidates()
            await d.complete(
                lanes.Job(messages=MESSAGES, params={"plugins": [{"id": "web"}], "seed": 3})
            )
    assert candidate.billing_switches == {"plugins"} and candidate.tool_prompt_tokens == 777
    assert dict(x.requests()[0].body).get("seed") == 3
    assert "plugins" not in x.requests()[0].body


async def test_a_byok_lane_sends_the_clients_billing_switches(env, autojump_clock):
    """A client's own key is its own money: its request reaches the provider as it was sent."""
    async with open_fake("own", models=("m:free",)) as own:
        table = free_lane(
            "own", own.base_url, models=["m:free"], byok=True, billing_switches=["models"]
        )
        async with lanes.open_dispatcher(config(table), env=env) as d:
            await d.complete(
                lanes.Job(
                    messages=MESSAGES,
                    params={"models": ["a", "b"]},
                    keys={"own": "sk-own-key-0123456789"},
                )
            )
    assert own.requests()[0].body["models"] == ["a", "b"]


async def test_a_paid_skip_names_the_unpriced_parameter(env, autojump_clock):
    """A paid request carrying `service_tier: "priority"` is never sent; the error says why."""
    async with (
        open_fake("paid", models=("paid-model",)) as paid,
        lanes.open_dispatcher(config(paid_lane("paid", paid.base_url)), env=env) as d,
    ):
        with pytest.raises(lanes.JobFailed) as failed:
            await d.complete(
                lanes.Job(
                    messages=MESSAGES, model="paid/paid-model", params={"service_tier": "priority"}
                )
            )
    assert paid.requests() == []
    assert "service_tier='priority'" in str(failed.value)

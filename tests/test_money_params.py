"""What a request may carry when money is at stake: only parameters its worst case prices on a
paid attempt, none of a lane's billing switches on a free one, and a credit attempt held to its
worst case against the credits left (review findings 1, 2, 8 and 10)."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st
from test_money import IN, MESSAGES, OUT, greedy, json_values, paid_candidate, readable_bytes

import lanes
from helpers import config, free_lane, local_lane, paid_lane
from lanes._core.config.schema import LaneConfig
from lanes._core.dialects import messages_api, responses_api
from lanes._core.freetier.kinds import CreditBased
from lanes._core.freetier.manager import FreeTierManager, LaneTerms
from lanes._core.model.candidates import Candidate
from lanes._core.policy.spend import (
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
from lanes.testing import answer, open_fake

#: The most any provider documents adding to a request with tools (Claude 3 Opus, `auto`).
LARGEST_DOCUMENTED_TOOL_PROMPT = 530
SWITCHES = frozenset({"models", "plugins", "route"})
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}

#: Parameter names a client may send: priced ones, known billing switches, and made-up ones.
names = st.sampled_from(
    sorted(
        {*PRICED_PARAMS, *SWITCHES, "service_tier", "web_search_options", "audio", "prediction"}
        | {"modalities", "store", "thinking", "search_parameters", "x_new_billing_switch"}
    )
) | st.from_regex(r"[a-z_]{1,12}", fullmatch=True)
extras = st.dictionaries(names, json_values, max_size=5)


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
    candidate = paid_candidate(billing_switches=switches, tool_prompt_tokens=declared)
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
    paid = paid_candidate(billing_switches=frozenset({"plugins"}))
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


# -- credits: held like the ceiling ---------------------------------------------------------------


@given(
    budget=st.floats(1e-6, 1.0),  # 0: credits not tracked (nothing to hold against)
    steps=st.lists(st.tuples(st.floats(0.0, 0.5), st.floats(0.0, 1.0), st.booleans()), max_size=40),
)
def test_credits_are_never_overdrawn_by_bills_within_their_holds(budget, steps):
    """Whatever the order of attempts (each held at its worst case, admitted only when it fits)
    and their settlements (each at most its hold), what is spent never exceeds the credits, and
    nothing stays held once every attempt settled."""
    m = FreeTierManager(random=lambda: 0.0)
    m.register("c", LaneTerms(kind=CreditBased(budget_usd=budget, reset="never")))
    in_flight: list[float] = []
    for amount, fraction, settle_first in steps:
        if settle_first and in_flight:
            held = in_flight.pop(0)
            m.settle_credit("c", held, held * fraction, now=0.0)
        if m.hold_credit("c", amount, now=0.0) is None:
            in_flight.append(amount)
        spent_and_held = m.credit_spent("c", 0.0) + sum(in_flight)
        assert spent_and_held <= budget + 1e-9
    for held in in_flight:
        m.settle_credit("c", held, held, now=0.0)
    assert m.credit_spent("c", 0.0) <= budget + 1e-9 and m.credit_held() == {}


PRICED_M = {"id": "m", "input_usd_per_mtok": IN, "output_usd_per_mtok": OUT}
CREDITS: dict[str, Any] = {
    "free_tier": {"kind": "credits", "budget_usd": 0.01, "reset": "monthly"},
    "models": [PRICED_M],
}


@pytest.mark.free_lane
async def test_concurrent_credit_attempts_never_overdraw_the_credits(env, autojump_clock):
    """Twenty jobs at once, each fitting alone in $0.01 of credits but not together, against an
    upstream that bills the whole cap: the holds let through only what the credits can pay."""
    async with open_fake("cred", models=("m",)) as cred:
        cred.script("m", answer(delay_s=1.0, usage=greedy()))
        table = free_lane("cred", cred.base_url, models=["m"]) | CREDITS
        policy = {"free_tier_fallback": "off", "paid_max_tokens": 1000}
        async with lanes.open_dispatcher(config(table, policy=policy), env=env) as d:
            outcomes: list[str] = []

            async def one() -> None:
                try:
                    await d.complete(lanes.Job(messages=MESSAGES, deadline_s=30))
                    outcomes.append("served")
                except lanes.JobFailed as exc:
                    outcomes.append(str(exc))

            async with trio.open_nursery() as nursery:
                for _ in range(20):
                    nursery.start_soon(one)
            left = d.manager.credit_left("cred", d.now_wall())
            held = d.manager.credit_held()
    bills = [
        (u["prompt_tokens"] * IN + u["completion_tokens"] * OUT) / 1e6
        for u in (greedy()(dict(r.body)) for r in cred.requests())
    ]
    served = outcomes.count("served")
    assert 0 < served < 20 and len(bills) == served
    assert sum(bills) <= 0.01 + 1e-12 and left is not None and left >= -1e-12
    assert all(r.body["max_tokens"] == 1000 for r in cred.requests())  # capped like paid
    assert held == {}
    assert any("credits left" in o for o in outcomes if o != "served")


@pytest.mark.free_lane
async def test_a_credit_model_without_a_price_is_skipped_unless_declared_free(env, autojump_clock):
    """Credits can not hold an unknown price: such a model is skipped, saying so; a model the
    config declares `free` costs no credits and is served."""
    async with open_fake("cred", models=("unpriced", "gift")) as cred:
        table = free_lane("cred", cred.base_url, models=["unpriced", "gift"])
        table["free_tier"] = CREDITS["free_tier"]
        table["models"] = [{"id": "unpriced"}, {"id": "gift", "free": True}]
        async with lanes.open_dispatcher(config(table), env=env) as d:
            with pytest.raises(lanes.JobFailed) as failed:
                await d.complete(lanes.Job(messages=MESSAGES, model="cred/unpriced"))
            reply = await d.complete(lanes.Job(messages=MESSAGES, model="cred/gift"))
    assert "cred/unpriced has no known price" in str(failed.value)
    assert reply.model == "gift" and [r.model for r in cred.requests()] == ["gift"]


async def test_a_paid_model_of_a_credit_lane_spends_its_credits_too(env, autojump_clock):
    """A model a credit lane marks `free = false` is paid (held to the ceiling) and what it costs
    comes out of the lane's credits as well: the provider bills the one account."""
    async with open_fake("cred", models=("m",)) as cred:
        table = free_lane("cred", cred.base_url, models=["m"]) | CREDITS
        table["models"] = [{**PRICED_M, "free": False}]
        policy = {"free_tier_fallback": "allow"}
        async with lanes.open_dispatcher(config(table, policy=policy), env=env) as d:
            reply = await d.complete(lanes.Job(messages=MESSAGES, model="cred/m"))
            spent = d.manager.credit_spent("cred", d.now_wall())
            held = d.manager.credit_held()
    assert reply.cost_usd > 0 and spent == pytest.approx(reply.cost_usd)
    assert held == {}


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user", "content": [{"type": ["text"], "text": "hi"}]},  # a type that is a list
        {"role": "user", "content": [{"type": "document_url", "document_url": "https://x"}]},
        {"role": "assistant", "content": None, "audio": {"id": "audio_1"}},
        {"role": "user", "content": ["a bare string part"]},
        # a cache write bills above the input price (1.25x, or 2x for an hour), as a message's
        # own `cache_control` would: a content part's fields are an allowlist too
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral", "ttl": "1h"}}
            ],
        },
    ],
)
def test_content_outside_the_message_allowlist_is_unbounded_and_never_crashes(message):
    """Messages are an allowlist for paid: a field or content part the worst case does not price
    (whatever its shape, even one the HTTP door would refuse) makes it unbounded, not a crash."""
    paid = Candidate(
        lane="p", model="m", tier="paid", input_usd_per_mtok=IN, output_usd_per_mtok=OUT
    )
    job = lanes.Job(messages=[message], params={"max_tokens": 10})
    assert isinstance(worst_case(paid, job), Unbounded)

"""What bounds a paid (or credit) attempt, through a real sidecar or the dispatcher over loopback
fakes: it carries nothing its reservation does not price — no billing switch, no content priced
as its few bytes, a provider's own tool prompt reserved — a credit lane never sends more than its
credits can pay for, and an answer that may have billed (lost at the gateway, or a stream cut at
its deadline) stays counted in full.

These guard test_money.py's and test_money_params.py's concerns; they live here while the money
path and those files are reworked.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import pytest

import lanes
from helpers import config, free_lane, http_client, spent
from lanes._core.model.candidates import Candidate
from lanes._core.policy.spend import billed_bytes, paid_request, worst_case
from lanes.testing import answer, open_fake, status
from sidecar import open_sidecar

MESSAGES = [{"role": "user", "content": "What does this cost?"}]
IN, OUT = 1.0, 2.0  # the paid fakes' prices, USD per million tokens (lanes.harness.configs)
PAID = ("paid", "paid", ["paid-model"])
PRICED = {"input_usd_per_mtok": IN, "output_usd_per_mtok": OUT}

# == what a paid attempt may carry ================================================================


@pytest.mark.parametrize(
    "extra",
    [
        {"service_tier": "priority"},  # OpenAI bills priority processing above the list price
        {"web_search_options": {}},  # search models bill a fee per call, beside tokens
        {"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}},
        {"prediction": {"type": "content", "content": "x" * 2000}},  # rejected: output price
    ],
    ids=["service_tier", "web_search_options", "audio_output", "prediction"],
)
async def test_a_paid_attempt_never_carries_a_billing_switch_the_reservation_does_not_price(extra):
    """The reservation prices input bytes, the output cap, images and `n` — nothing else — so a
    paid attempt must not send a parameter that makes the provider bill more than that (or the
    request must be refused for paid, as audio input is)."""
    async with (
        open_sidecar(PAID, policy={"free_tier_fallback": "allow"}) as (url, fakes),
        http_client() as http,
    ):
        await http.post(f"{url}/chat/completions", json={"messages": MESSAGES, **extra})
    sent = [dict(r.body) for r in fakes["paid"].requests()]
    assert not any(set(extra) & set(body) for body in sent), sent


def test_the_reservation_covers_a_providers_own_tool_prompt():
    """Anthropic bills a tool-use system prompt it adds itself (346 input tokens for `auto`) on
    any request with tools; a one-tool request is ~60 bytes, so the byte bound reserves ~60 input
    tokens for a bill of ~400. A lane whose provider adds hidden input must reserve it."""
    claude = Candidate(
        lane="anthropic",
        model="claude-haiku-4-5",
        tier="paid",
        input_usd_per_mtok=1.0,
        output_usd_per_mtok=5.0,
    )
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    job = lanes.Job(messages=[{"role": "user", "content": "hi"}], params={"tools": [tool]})
    sent = paid_request(job, cap_param="max_tokens", paid_max_tokens=1)
    billed = ((billed_bytes(sent.body("claude-haiku-4-5")) + 346) * 1.0 + 1 * 5.0) / 1e6
    reserved = worst_case(claude, sent)
    assert isinstance(reserved, float) and reserved >= billed, (reserved, billed)


DOCUMENT = [
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "Summarise this."},
            # Mistral's document understanding: the provider fetches the PDF and bills its tokens
            {"type": "document_url", "document_url": "https://example.com/1000-pages.pdf"},
        ],
    }
]


AUDIO_REFERENCE = [
    {"role": "user", "content": "Say it again."},
    # OpenAI: a previous audio answer, by id — billed again as audio input tokens
    {"role": "assistant", "content": None, "audio": {"id": "audio_abc123"}},
    {"role": "user", "content": "Louder."},
]


@pytest.mark.parametrize("messages", [DOCUMENT, AUDIO_REFERENCE], ids=["document_url", "audio_id"])
async def test_content_the_reservation_does_not_price_never_reaches_a_paid_model(messages):
    """ "Anything else ... makes the worst case unbounded: the paid candidate is skipped." The
    parameters are an allowlist, but the messages are checked against a denylist of media part
    types (`spend._MEDIA`): a part type it does not list (Mistral's `document_url`, fetched and
    billed by the provider) or a message field (OpenAI's assistant `audio` reference, billed as
    audio input) rides a paid attempt priced as its few bytes."""
    async with (
        open_sidecar(("paid", "paid", ["paid-model"])) as (url, fakes),
        http_client() as http,
    ):
        await http.post(
            f"{url}/chat/completions", json={"messages": messages, "model": "paid/paid-model"}
        )
    assert fakes["paid"].requests() == []


# == what a free or credit attempt may carry ======================================================


@pytest.mark.free_lane
async def test_a_free_openrouter_request_can_not_buy_paid_models_or_plugins():
    """With `free_tier_fallback = off`, a job on OpenRouter's free model never carries the
    router's own spending switches — `models` (fallback to other, paid models), `plugins` (the
    web plugin is billed per result), `route` — to the provider: a free lane has no reservation
    and no consent, so these would bill the operator's account behind the ceiling."""
    router = (
        "or",
        "free",
        ["m:free"],
        {"module": "openrouter", "free_tier": {"kind": "free_models"}},
    )
    async with (
        open_sidecar(router, policy={"free_tier_fallback": "off"}) as (url, fakes),
        http_client() as http,
    ):
        await http.post(
            f"{url}/chat/completions",
            json={
                "messages": MESSAGES,
                "models": ["openai/o1-pro", "anthropic/claude-opus-4"],
                "plugins": [{"id": "web"}],
                "route": "fallback",
            },
        )
    sent = [dict(r.body) for r in fakes["or"].requests()]
    assert not any({"models", "plugins", "route"} & set(body) for body in sent), sent


def greedy(request: Mapping[str, Any]) -> dict[str, int]:
    """What an upstream may bill: every choice, the whole cap."""
    n = request.get("n", 1)
    completion = n * (request.get("max_tokens") or 100_000)
    return {"prompt_tokens": 100 * n, "completion_tokens": completion, "total_tokens": completion}


@pytest.mark.free_lane
async def test_a_credit_lane_never_sends_more_than_its_credits_can_pay_for():
    """A credit lane with $0.001 of credits left admits a request whose worst case is $1.60:
    nothing bounds a request against the credits (there is no reservation), so one request
    overspends them 1,600× — and a provider that bills past free credits bills the card."""
    credits = {
        "free_tier": {"kind": "credits", "budget_usd": 0.001, "reset": "monthly"},
        "models": [{"id": "m", "input_usd_per_mtok": IN, "output_usd_per_mtok": OUT}],
    }
    async with open_sidecar(
        ("cred", "free", ["m"], credits), policy={"free_tier_fallback": "off"}
    ) as (
        url,
        fakes,
    ):
        fakes["cred"].script("m", answer(usage=greedy))
        async with http_client() as http:
            await http.post(
                f"{url}/chat/completions",
                json={"messages": MESSAGES, "n": 8, "max_tokens": 100_000},
            )
            lanes_now = (await http.get(f"{url}/lanes")).json()["lanes"]
    left = next(lane for lane in lanes_now if lane["name"] == "cred")["credits_left_usd"]
    assert left >= 0.0, left


@pytest.mark.free_lane  # a credit lane is borrowed capacity
@pytest.mark.parametrize(
    "paid_answer",
    [lambda: answer(usage={"prompt_tokens": -1}), lambda: status(503)],
    ids=["garbage_usage", "503"],
)
async def test_a_credit_lanes_paid_attempt_that_may_have_billed_spends_its_credits(
    paid_answer: Any, env, autojump_clock
):
    """ "Credits are not overdrawn by one request"; a paid model of a credit lane "spends the
    credits". When its answer has no sane usage (or is a 5xx), the paid ledger keeps the whole
    reservation — the provider may have billed it — but the credits are charged nothing
    (`count_usage` only on a clean answer), so the lane's credit model is then sent a request
    whose worst case no longer fits in what is really left."""
    async with open_fake("cred", models=("m", "f")) as cred:
        cred.script("m", paid_answer())
        table = free_lane("cred", cred.base_url, models=["m", "f"])
        table["free_tier"] = {"kind": "credits", "budget_usd": 0.01, "reset": "monthly"}
        table["models"] = [{"id": "m", "free": False, **PRICED}, {"id": "f", **PRICED}]
        policy = {"free_tier_fallback": "allow", "transient_retries": 0}
        async with lanes.open_dispatcher(config(table, policy=policy), env=env) as d:
            with contextlib.suppress(lanes.JobFailed):
                await d.complete(lanes.Job(messages=MESSAGES, model="cred/m"))
            may_have_billed = d.paid_spent_today()  # ~$0.0083 of the $0.01
            with contextlib.suppress(lanes.JobFailed):
                await d.complete(lanes.Job(messages=MESSAGES, model="cred/f"))  # worst ~$0.0083
    assert may_have_billed > 0.005
    assert cred.requests("f") == []


# == an answer that may have billed stays counted ================================================


async def test_a_gateway_timeout_from_a_paid_upstream_stays_counted():
    """ "A lost answer ... keeps the full reservation." A 504 (or 502) from the gateway in front
    of a provider is a lost answer: the model may have run and billed. It settles at $0 today, as
    if the provider had refused the request."""
    async with open_sidecar(PAID, policy={"free_tier_fallback": "allow"}) as (url, fakes):
        fakes["paid"].script("paid-model", status(504, {"error": {"message": "gateway timeout"}}))
        async with http_client() as http:
            response = await http.post(f"{url}/chat/completions", json={"messages": MESSAGES})
            ledger = await spent(http, url)
    assert response.status_code >= 500 and len(fakes["paid"].requests()) == 1
    assert ledger > 0.0


async def test_a_paid_stream_that_never_ends_is_cut_at_the_deadline_and_kept_in_full():
    """Held: a paid upstream streaming for ever ends at the job's deadline with an in-band error
    (never `[DONE]`), and the ledger keeps the whole reservation."""
    async with open_sidecar(PAID, policy={"free_tier_fallback": "allow"}) as (url, fakes):
        fakes["paid"].script("paid-model", answer(text="word " * 100_000, chunk_delay_s=0.001))
        async with http_client() as http:
            streamed = await http.post(
                f"{url}/chat/completions",
                json={"messages": MESSAGES, "stream": True},
                headers={"x-lanes-deadline-ms": "1000"},
            )
            ledger = await spent(http, url)
    candidate = Candidate(
        lane="paid", model="paid-model", tier="paid", input_usd_per_mtok=IN, output_usd_per_mtok=OUT
    )
    reserved = worst_case(
        candidate,
        paid_request(lanes.Job(messages=MESSAGES), cap_param="max_tokens", paid_max_tokens=4096),
    )
    assert "stream_interrupted" in streamed.text and "[DONE]" not in streamed.text
    assert isinstance(reserved, float) and ledger == pytest.approx(reserved)

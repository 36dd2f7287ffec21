"""A second hostile review of the money path: three findings, each kept as the test that showed it.

Every test asserts what README ("money") or `docs/security.md` promises; each failed before its fix
(as a strict xfail) and now guards it. Everything runs against `lanes.testing` fakes on loopback.
"""

from __future__ import annotations

import contextlib
from typing import Any

import httpx2
import pytest
import trio

import lanes
from helpers import config, free_lane, paid_lane
from lanes._core.engine.recovery import Chunk, Event, relay
from lanes.testing import answer, open_fake, status, stream_cut
from sidecar import open_sidecar

MESSAGES = [{"role": "user", "content": "What does this cost?"}]
IN, OUT = 1.0, 2.0  # the paid fakes' prices, USD per million tokens (lanes.testing.harness.configs)

# == finding 1: message content is a denylist, not an allowlist ===================================

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
        httpx2.AsyncClient(trust_env=False, timeout=30) as http,
    ):
        await http.post(
            f"{url}/chat/completions", json={"messages": messages, "model": "paid/paid-model"}
        )
    assert fakes["paid"].requests() == []


# == finding 2: a recovery pays on a grant revoked since the job began ============================

PREFILL = {
    "models": [
        {"id": m, "input_usd_per_mtok": IN, "output_usd_per_mtok": OUT, "prefill": True}
        for m in ("p1", "p2")
    ]
}


async def test_a_grant_revoked_mid_stream_is_not_spent_by_its_recovery(env, autojump_clock):
    """No paid request without consent; a grant is revoked with `DELETE /v1/grants/{id}`. A
    stream served by a paid model under a grant keeps `record.approval = "granted"` for the whole
    job, so when the stream is cut after the grant was revoked, the recovery's walk (same record)
    sends a paid request to another model without asking."""
    async with open_fake("c", models=("p1", "p2")) as c:
        c.script("p1", stream_cut(after=3))
        cfg = config(
            paid_lane("c", c.base_url, models=["p1", "p2"]) | PREFILL,
            aliases={"pp": ["c/p1", "c/p2"]},  # an alias is not a pinned model: consent is asked
            policy={
                "free_tier_fallback": "ask",
                "paid_attempts": 2,
                "paid_ceiling_usd_per_day": 100.0,
            },
        )
        async with lanes.open_dispatcher(cfg, env=env) as d:
            approvals = d.routing.approvals
            revoked: list[bool] = []

            async def emit(event: Event) -> None:
                if isinstance(event, Chunk) and not revoked:  # the user stops paid fallback
                    revoked.append(await approvals.revoke("grant-anonymous"))

            async def grant() -> None:
                while not approvals.pending():  # noqa: ASYNC110 - no event for a new approval
                    await trio.sleep(0.05)
                await approvals.decide(approvals.pending()[0].id, 3600.0)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(grant)
                await relay(d, lanes.Job(messages=MESSAGES, model="pp", deadline_s=60), emit)
    assert revoked == [True]
    assert [r.model for r in c.requests()] == ["p1"]


# == finding 3: a credit lane's paid model spends its credits only when it answers cleanly ========

PRICED = {"input_usd_per_mtok": IN, "output_usd_per_mtok": OUT}


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
    (`record_usage` only on a clean answer), so the lane's credit model is then sent a request
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

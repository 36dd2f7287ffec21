"""A third hostile review of the money path and the HTTP surface: each finding kept as the test that
showed it (a strict xfail until it was fixed), now guarding the fix.

Every test asserts what README ("money") or `docs/security.md` promises. Everything runs against
`lanes.testing` fakes on loopback.
"""

from __future__ import annotations

import contextlib

import trio

import lanes
from helpers import config, paid_lane
from lanes.testing import answer, open_fake, status

MESSAGES = [{"role": "user", "content": "What does this cost?"}]
IN, OUT = 1.0, 2.0  # the paid fakes' prices, USD per million tokens (lanes.testing.harness.configs)
PRICED = {"input_usd_per_mtok": IN, "output_usd_per_mtok": OUT}

# == finding 1: a same-candidate retry pays on a grant revoked since its first attempt ===========


async def test_a_grant_revoked_before_a_retry_pays_for_no_retry(env, autojump_clock):
    """ "A revoked grant pays for nothing more, not even the next attempt of a job that began
    under it." Consent is asked once per candidate, before the walk's same-candidate retry loop:
    a paid attempt that fails transiently (a 503) is retried on the same model after the grant
    was revoked, without asking again."""
    async with open_fake("c", models=("p1",)) as c:
        c.script("p1", status(503), answer())
        cfg = config(
            paid_lane("c", c.base_url, models=["p1"]) | {"models": [{"id": "p1", **PRICED}]},
            aliases={"pp": ["c/p1"]},  # an alias is not a pinned model: consent is asked
            policy={
                "free_tier_fallback": "ask",
                "paid_attempts": 2,
                "transient_retries": 1,
                "paid_ceiling_usd_per_day": 100.0,
            },
        )
        async with lanes.open_dispatcher(cfg, env=env) as d:
            approvals = d.routing.approvals
            revoked: list[bool] = []

            async def grant_then_revoke() -> None:
                while not approvals.pending():  # noqa: ASYNC110 - no event for a new approval
                    await trio.sleep(0.001)
                await approvals.decide(approvals.pending()[0].id, 3600.0)
                while not c.requests():  # noqa: ASYNC110 - the fake sets no event
                    await trio.sleep(0.001)
                revoked.append(await approvals.revoke("grant-anonymous"))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(grant_then_revoke)
                with contextlib.suppress(lanes.JobFailed):
                    await d.complete(lanes.Job(messages=MESSAGES, model="pp", deadline_s=60))
    assert revoked == [True]
    assert len(c.requests("p1")) == 1

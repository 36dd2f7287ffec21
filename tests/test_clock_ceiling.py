"""Processes and hosts that disagree — about the day, or about the ceiling — share one paid
budget: the stricter one (issue 28, Why 5 and Why 6).

Two dispatchers in one trio run stand for two processes on one SQLite file, or two hosts on one
Redis: each has its own connection to the store, its own wall source and its own config. The
upstream bills the most the request as sent allows (`test_money.greedy`), so what it bills is the
worst case every reservation holds.
"""

from __future__ import annotations

import time
from contextlib import AsyncExitStack
from typing import Any

import pytest

import lanes
from helpers import config, paid_lane
from lanes.testing import FakeProvider, answer, open_fake

MESSAGES = [{"role": "user", "content": "Whose day is it?"}]
DAY_S = 86400.0


def state_of(store: str, request: pytest.FixtureRequest, tmp_path: Any) -> str:
    if store == "redis":
        return str(request.getfixturevalue("redis_server").url)
    return str(tmp_path / "shared.db")


async def spend_until_refused(
    dispatchers: list[lanes.Dispatcher], jobs: int = 40
) -> tuple[int, list[str]]:
    """Send paid jobs to the dispatchers in turn; (jobs served, the refusals' messages)."""
    served, refused = 0, []
    for i in range(jobs):
        job = lanes.Job(messages=MESSAGES, model="paid/paid-model", params={"max_tokens": 100})
        try:
            await dispatchers[i % len(dispatchers)].complete(job)
            served += 1
        except lanes.PaidBudgetExhausted as exc:
            refused.append(str(exc))
    return served, refused


def billed_by(paid: FakeProvider) -> float:
    from test_money import billed

    return sum(billed(dict(r.body)) for r in paid.requests())


def paid_config(state: str, ceiling: float, fallback: str = "allow") -> lanes.Config:
    return config(
        paid_lane("paid", "http://127.0.0.1:1"),  # replaced below by the fake's address
        state=state,
        policy={"free_tier_fallback": fallback, "paid_ceiling_usd_per_day": ceiling},
    )


def with_url(cfg: lanes.Config, url: str) -> lanes.Config:
    import attrs

    return attrs.evolve(cfg, lanes=[attrs.evolve(cfg.lanes[0], base_url=url)])


@pytest.mark.parametrize("store", ["sqlite", "redis"])
async def test_two_processes_a_day_apart_share_one_ceiling(store, request, tmp_path, env):
    """Why 5: two processes on one state whose clocks disagree about the UTC day (one is a day
    ahead) bill at most one ceiling between them, not one each."""
    from test_money import greedy

    ceiling = 0.002
    state = state_of(store, request, tmp_path)
    async with open_fake("paid", models=("paid-model",)) as paid:
        paid.script("paid-model", answer(usage=greedy()))
        cfg = with_url(paid_config(state, ceiling), paid.base_url)
        async with AsyncExitStack() as stack:
            right = await stack.enter_async_context(lanes.open_dispatcher(cfg, env=env))
            ahead = await stack.enter_async_context(
                lanes.open_dispatcher(cfg, env=env, epoch_now=time.time() + DAY_S)
            )
            served, refused = await spend_until_refused([right, ahead])
    assert served > 0 and refused
    assert billed_by(paid) <= ceiling + 1e-12


@pytest.mark.parametrize("store", ["sqlite", "redis"])
async def test_two_hosts_with_different_ceilings_bill_under_the_smaller(
    store, request, tmp_path, env
):
    """Why 6: two hosts (or processes) on one state configured with ceilings of $0.002 and $0.01
    (a rolling change) bill at most the smaller between them, whichever started first."""
    from test_money import greedy

    state = state_of(store, request, tmp_path)
    async with open_fake("paid", models=("paid-model",)) as paid:
        paid.script("paid-model", answer(usage=greedy()))
        loose = with_url(paid_config(state, 0.01), paid.base_url)
        strict = with_url(paid_config(state, 0.002), paid.base_url)
        async with AsyncExitStack() as stack:
            first = await stack.enter_async_context(lanes.open_dispatcher(loose, env=env))
            second = await stack.enter_async_context(lanes.open_dispatcher(strict, env=env))
            served, refused = await spend_until_refused([first, second])
    assert served > 0 and refused
    assert billed_by(paid) <= 0.002 + 1e-12

"""The hostile review of issue 45's speed changes (review45): each test failed before its fix."""

from __future__ import annotations

import contextlib

import pytest
import trio

import lanes
from helpers import config, free_lane, paid_lane
from lanes.testing import answer, open_fake

MESSAGES = [{"role": "user", "content": "Say the pangram."}]


async def _at_once(d: lanes.Dispatcher, model: str, n: int) -> None:
    """`n` whole-answer jobs to `model` at once (those no lane takes end quietly)."""

    async def one() -> None:
        with contextlib.suppress(lanes.NoLaneAvailable):
            await d.complete(lanes.Job(messages=MESSAGES, model=model, deadline_s=30))

    async with trio.open_nursery() as nursery:
        for _ in range(n):
            nursery.start_soon(one)


@pytest.mark.free_lane
async def test_jobs_beside_a_cold_probe_keep_to_the_known_quota(env, autojump_clock):
    """Jobs that go beside a cold model's probe at its quiet time are still held to the lane's
    known request quota (rpm = 3): at most 3 requests reach it in the minute, not one per job."""
    async with open_fake("wall", models=("slow",)) as wall, open_fake("c") as c:
        wall.script("slow", answer(delay_s=5.0))
        lane = free_lane("wall", wall.base_url, models=["slow"], attempt_timeout_s=20)
        lane["free_tier"] = {"kind": "rate_limited", "rpm": 3}
        async with lanes.open_dispatcher(config(lane, paid_lane("c", c.base_url)), env=env) as d:
            await _at_once(d, "wall/slow", 8)
    assert len(wall.requests()) <= 3, [r.at for r in wall.requests()]

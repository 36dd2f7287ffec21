"""FREE_LANE=off: borrowed capacity is switched off and nothing else; the rest still serves."""

from __future__ import annotations

import os

import lanes
from helpers import config, free_lane, local_lane, paid_lane
from lanes.testing import open_fake

JOB = [{"role": "user", "content": "hi"}]


async def test_free_lane_off_sends_nothing_to_free(env, caplog_lanes, autojump_clock):
    """With FREE_LANE=off the free fake receives no request; local serves, then paid."""
    async with (
        open_fake("free", models=("free-model",)) as free,
        open_fake("local", models=("local-model",)) as local,
        open_fake("paid", models=("paid-model",)) as paid,
    ):
        cfg = config(
            free_lane("free", free.base_url),
            local_lane("local", local.base_url),
            paid_lane("paid", paid.base_url),
        )
        async with lanes.open_dispatcher(cfg, env={**env, "FREE_LANE": "off"}) as dispatcher:
            first = await dispatcher.complete(lanes.Job(messages=JOB))
            await local.refuse()
            second = await dispatcher.complete(lanes.Job(messages=JOB))
            async with dispatcher.open_stream(lanes.Job(messages=JOB)) as stream:
                [chunk async for chunk in stream]
    assert free.requests() == []
    assert (first.lane, second.lane, stream.lane) == ("local", "paid", "paid")
    assert second.skips[-1].reason == "free lane off (FREE_LANE=off)"
    assert (
        "free lane off (FREE_LANE=off): serving from local and paid lanes only"
        in caplog_lanes.messages
    )


async def test_free_lane_on_by_default(env, autojump_clock):
    """Without the switch, a free lane placed first is used (unless this is the kill-switch run)."""
    async with open_fake("free", models=("free-model",)) as free:
        cfg = config(free_lane("free", free.base_url))
        async with lanes.open_dispatcher(cfg, env={**env, "FREE_LANE": "on"}) as dispatcher:
            reply = await dispatcher.complete(lanes.Job(messages=JOB))
    assert reply.lane == "free" and len(free.requests()) == 1


async def test_ambient_switch_reaches_the_dispatcher(env, autojump_clock):
    """The process's FREE_LANE reaches every dispatcher that reads the environment."""
    async with (
        open_fake("free", models=("free-model",)) as free,
        open_fake("paid", models=("paid-model",)) as paid,
    ):
        cfg = config(free_lane("free", free.base_url), paid_lane("paid", paid.base_url))
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
            reply = await dispatcher.complete(lanes.Job(messages=JOB))
    off = os.environ.get("FREE_LANE", "").lower() in {"off", "0", "false", "no", "disabled"}
    assert reply.lane == ("paid" if off else "free")
    assert len(free.requests()) == (0 if off else 1)


async def test_runtime_switch_holds_for_every_process_sharing_the_state_file(
    env, tmp_path, autojump_clock
):
    """`lanes lane off` on one dispatcher reaches another on the same state file within a sync, and
    survives a restart until switched on again."""
    import trio

    async with (
        open_fake("local", models=("local-model",)) as local,
        open_fake("paid", models=("paid-model",)) as paid,
    ):
        cfg = config(
            local_lane("local", local.base_url),
            paid_lane("paid", paid.base_url),
            state=str(tmp_path / "state.db"),
        )
        async with (
            lanes.open_dispatcher(cfg, env=env) as one,
            lanes.open_dispatcher(cfg, env=env) as other,
        ):
            one.lane_off("local")
            await trio.sleep(0.6)  # one sync interval
            switched = (await other.complete(lanes.Job(messages=JOB))).lane
        async with lanes.open_dispatcher(cfg, env=env) as restarted:
            after_restart = (await restarted.complete(lanes.Job(messages=JOB))).lane
            restarted.lane_on("local")
            back = (await restarted.complete(lanes.Job(messages=JOB))).lane
    assert (switched, after_restart, back) == ("paid", "paid", "local")
    assert len(local.requests()) == 1

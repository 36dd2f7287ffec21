"""Redis faults a job must not wait on: its own host's probe lease (the lease's own rules are
tests/test_state_contract_leases.py's), and a Redis that hangs."""

from __future__ import annotations

import pytest
import trio

import lanes
from helpers import config, free_lane, paid_lane, store_up
from lanes.testing import open_fake, status

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.free_lane
async def test_back_to_back_jobs_on_a_failing_cold_model_never_wait_for_the_deadline(
    redis_server, env, tmp_path
):
    """Redis state, a free model that always fails, a paid lane behind it: ten jobs one after the
    other each probe the free model and are served by the paid lane — none waits on the lease its
    own host holds until its deadline."""
    async with (
        open_fake("free", models=("free-model",)) as free,
        open_fake("paid", models=("paid-model",)) as paid,
    ):
        free.script("free-model", status(503))
        cfg = config(
            free_lane("free", free.base_url, breaker={"failures": 100}),
            paid_lane("paid", paid.base_url),
            state=redis_server.url,
            local_state=str(tmp_path / "local.db"),
            policy={"free_tier_fallback": "allow", "transient_retries": 0},
        )
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
            await store_up(dispatcher, 10)
            served = []
            for _ in range(10):
                reply = await dispatcher.complete(lanes.Job(messages=MESSAGES, deadline_s=3.0))
                served.append((reply.lane, [a.key for a in reply.attempts]))
    assert all(lane == "paid" for lane, _ in served)
    assert all(keys == ["free/free-model", "paid/paid-model"] for _, keys in served), served
    assert len(free.requests()) == 10


async def test_a_hung_redis_never_holds_a_job_past_its_deadline(redis_server, env, tmp_path):
    """Redis stops answering (SIGSTOP) with a 2 s socket timeout: a paid job with a 0.5 s deadline
    ends by its deadline (paid closed), not at the socket timeout."""
    async with open_fake("paid", models=("paid-model",)) as paid:
        cfg = config(
            paid_lane("paid", paid.base_url),
            state=redis_server.url,
            local_state=str(tmp_path / "local.db"),
        )
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
            await store_up(dispatcher, 10)
            redis_server.freeze()
            try:
                job = lanes.Job(messages=MESSAGES, deadline_s=0.5, params={"max_tokens": 5})
                start = trio.current_time()
                with pytest.raises(lanes.JobFailed) as failed:
                    await dispatcher.complete(job)
                elapsed = trio.current_time() - start
            finally:
                redis_server.thaw()
    assert failed.value.code in ("paid_budget_exhausted", "deadline_exceeded")
    assert elapsed < 0.5 + 1.0, elapsed  # the contract: deadline + 1 s, not the 2 s socket timeout
    assert paid.requests() == []

"""Redis faults a job must not wait on: its own host's probe lease, and a Redis that hangs."""

from __future__ import annotations

import time

import pytest
import trio

import lanes
from helpers import config, free_lane, paid_lane, store_up
from lanes._core.state.redis_store import RedisStore
from lanes._core.state.store import SQLiteStore
from lanes.testing import open_fake, status

MESSAGES = [{"role": "user", "content": "hi"}]


def host(url: str) -> RedisStore:
    store = RedisStore(url, local=SQLiteStore(":memory:"))
    store.begin_sync(time.time())
    store.flush()
    return store


def test_a_host_takes_over_its_own_lease_and_its_old_release_leaves_it(redis_server):
    """A host whose probe finished (its release not yet flushed) may probe again at once — never
    waiting on its own lease — while the other hosts still may not; flushing the old release does
    not free the new lease; flushing the new one does."""
    a, b = host(redis_server.url), host(redis_server.url)
    assert a.probe_lease("free/m", ttl_s=30.0) is True
    a.probe_done("free/m", ok=False)  # queued, not flushed
    assert a.probe_lease("free/m", ttl_s=30.0) is True  # no wait on its own lease
    assert b.probe_lease("free/m", ttl_s=30.0) is False
    a.flush()  # the first release: published, but the lease is the second one now
    assert b.probe_lease("free/m", ttl_s=30.0) is False
    a.probe_done("free/m", ok=False)
    a.flush()
    assert b.probe_lease("free/m", ttl_s=30.0) is True


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

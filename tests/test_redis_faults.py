"""Redis faults a job must not wait on: its own host's probe lease (the lease's own rules are
tests/test_state_contract_leases.py's), and a Redis that hangs."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable

import pytest
import redis
import trio

import lanes
from helpers import config, free_lane, local_lane, paid_lane, store_up
from lanes import load_config
from lanes._core.freetier.windows import window_id
from lanes._core.model.errors import ConfigError
from lanes._core.state.paid import PaidAsk
from lanes._core.state.redis_store import RedisStore, redacted
from lanes._core.state.store import SQLiteStore, StoreUnavailable
from lanes.harness.processes import free_port
from lanes.harness.redis_server import RedisSentinels, RedisServer
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


def _cluster_port() -> int:
    """A free port whose cluster bus port (10,000 higher) is free too."""
    while True:
        port = free_port()
        if port > 55535:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


def _cluster_ok(port: int) -> bool:
    info = redis.Redis(port=port, decode_responses=True).execute_command("CLUSTER", "INFO")
    if isinstance(info, dict):  # some redis-py versions parse the reply
        return bool(info.get("cluster_state") == "ok")
    return "cluster_state:ok" in str(info).split()


@pytest.fixture
def redis_cluster(tmp_path, redis_server):
    """A real 3-master Redis Cluster on loopback (three redis-servers joined by `redis-cli
    --cluster create`); `redis_server` first, so a missing binary skips or fails as it does."""
    nodes: list[RedisServer] = []
    try:
        for i in range(3):  # each stopped below, however far the start got
            node = RedisServer(tmp_path / f"node-{i}", _cluster_port(), "--cluster-enabled", "yes")
            nodes.append(node)
            node.start()
        subprocess.run(
            ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in nodes),
             "--cluster-replicas", "0", "--cluster-yes"],
            check=True, capture_output=True, timeout=30,
        )  # fmt: skip
        deadline = time.monotonic() + 30  # wall-clock: waiting for real processes to agree
        while not all(_cluster_ok(n.port) for n in nodes):
            assert time.monotonic() < deadline, "the cluster did not come up"  # wall-clock
            time.sleep(0.1)  # wall-clock: a blocking wait for child processes
        yield nodes
    finally:
        for node in nodes:
            node.stop()


async def test_a_redis_cluster_is_refused_in_one_line_and_free_serves(
    redis_cluster, env, tmp_path, caplog
):
    """`state` pointed at a node of a 3-master Cluster: one line says Cluster is not supported and
    what to do (not a `MovedError` about a key), paid stays closed, free and local work serve."""
    async with (
        open_fake("local", models=("local-model",)) as local,
        open_fake("paid", models=("paid-model",)) as paid,
    ):
        cfg = config(
            local_lane("local", local.base_url),
            paid_lane("paid", paid.base_url),
            state=f"redis://127.0.0.1:{redis_cluster[0].port}/0",
            local_state=str(tmp_path / "local.db"),
        )
        with caplog.at_level("WARNING", logger="lanes"):
            async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
                served = await dispatcher.complete(lanes.Job(messages=MESSAGES))
                paid_job = lanes.Job(messages=MESSAGES, model="paid/paid-model", deadline_s=2.0)
                with pytest.raises(lanes.JobFailed) as refused:
                    await dispatcher.complete(paid_job)
                await trio.sleep(1.2)  # two more syncs: still the one line
    assert served.lane == "local" and paid.requests() == []
    assert refused.value.code == "paid_budget_exhausted"
    said = [r.getMessage() for r in caplog.records if "state store" in r.getMessage()]
    assert len(said) == 1 and "Redis Cluster, which lanes does not support" in said[0]
    assert "Moved" not in said[0]


@pytest.fixture
def redis_sentinels(tmp_path, redis_server):
    """A real master (`redis_server`), a replica of it and three sentinels watching it on
    loopback (`lanes.harness.redis_server.RedisSentinels`)."""
    topology = RedisSentinels(redis_server, tmp_path / "sentinels").start()
    try:
        yield topology
    finally:
        topology.stop()


def _until(ready: Callable[[], bool], what: str, within_s: float = 30.0) -> None:
    deadline = time.monotonic() + within_s  # wall-clock: real processes agreeing
    while not ready():
        assert time.monotonic() < deadline, f"{what}: not within {within_s:g} s"  # wall-clock
        time.sleep(0.1)  # wall-clock: a blocking wait for child processes


def test_a_sentinel_failover_loses_no_reservation_and_lanes_follows_the_master(redis_sentinels):
    """`state = "redis+sentinel://…/lanes-master"` with one replica required (WAIT): paid
    reservations are made on the master; the master is killed (no shutdown); the sentinels
    promote the replica. The host's calls fail meanwhile (paid closed), then reach the new
    master by themselves (every host putting its own back first): every reservation is there,
    the total exact; with no replica left, the next reservation is refused (paid stays closed)
    and given back."""
    master, replica = redis_sentinels.master, redis_sentinels.replicas[0]
    store = RedisStore(
        redis_sentinels.url, local=SQLiteStore(":memory:"), min_replicas=1, loss_hold_s=0.0
    )
    now = time.time()
    store.begin_sync(now)
    store.flush()
    today = window_id("day", now)
    ask = PaidAsk(day=today, amount=0.01, ceiling=1.0, lane="p", model="m", job="j", cohort=None)
    made = [str(store.reserve(ask)) for _ in range(10)]
    assert all(m != "None" for m in made)
    master.kill()
    _until(lambda: redis_sentinels.master_port() == replica.port, "the failover", within_s=60)

    def synced() -> bool:
        try:
            store.begin_sync(time.time())
            store.flush()
        except StoreUnavailable:
            return False
        return store.up

    _until(synced, "the host back on the new master")
    after = redis.Redis(port=replica.port, decode_responses=True)
    assert sorted(after.hkeys(f"lanes:paid:{today}")) == sorted(made)
    assert int(after.get(f"lanes:paid-total:{today}") or 0) == 10 * 10**10  # $0.10 in pico
    # the host writes to the new master; with no replica left to hold a reservation, paid stays
    # closed, and what it asked for is given back at the next flush (it was never sent)
    with pytest.raises(StoreUnavailable, match="reached 0 of the 1 replica"):
        store.reserve(ask)
    assert int(after.get(f"lanes:paid-total:{today}") or 0) == 11 * 10**10
    store.flush()
    assert int(after.get(f"lanes:paid-total:{today}") or 0) == 10 * 10**10
    store.close()


def test_a_sentinel_url_is_read_and_its_password_never_shown():
    """The hosts, the service and the database are read from the URL; the password is in no
    message or page."""
    assert (
        redacted("redis+sentinel://:s3cret@10.0.0.5:26379,10.0.0.6:26379/mymaster/2")
        == "redis+sentinel://10.0.0.5:26379,10.0.0.6:26379/mymaster/2"
    )
    cfg = load_config({"state": "redis+sentinel://10.0.0.5:26379/mymaster"}, env={})
    assert cfg.shared_state
    with pytest.raises(ConfigError, match="names the master's service"):
        load_config({"state": "redis+sentinel://10.0.0.5:26379/"}, env={})

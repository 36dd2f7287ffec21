"""One batch queue in Redis shared by several hosts (here: several runners and sidecars in one
process, each with its own connection, on one real `redis-server`): one leads at a time, every
item is answered exactly once, a leader that dies mid-batch is taken over; the keys carry the
deployment's namespace and no expiry; a server that may evict them is said."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from typing import Any

import openai
import pytest
import trio
from batch_backends import RedisQueues, jsonl, line, make_batch

from lanes._core.batch.runner import LEASE_S, BatchRunner, ItemAnswer
from lanes._core.runtime.tasks import Background
from sidecar import open_sidecar

pytestmark = pytest.mark.slow  # a real redis-server


def runner(queue: Any, served: list[str], now_wall: Callable[[], float], *, hang: bool = False):
    """A host's runner whose items answer at once (or, `hang`, never), noting each it served."""

    async def serve(endpoint: str, body: bytes, client: str, deadline_s: float,
                    paid_cap: float | None = None) -> ItemAnswer:  # fmt: skip
        served.append(json.loads(body)["messages"][0]["content"].removeprefix("classify "))
        if hang:
            await trio.sleep_forever()
        return ItemAnswer(200, json.dumps({"choices": []}).encode(), "r")

    return BatchRunner(queue, serve, now_wall=now_wall, health=Background().task("batches"))


async def until(check: Callable[[], Any], within_s: float = 30.0) -> None:
    """Poll `check()` (awaited when it gives an awaitable) until it is true."""
    with trio.fail_after(within_s):
        while True:
            found = check()
            if await found if hasattr(found, "__await__") else found:
                return
            await trio.sleep(0.02)


def answered(queue: Any, batch: dict[str, Any]) -> list[str]:
    """The custom_ids of a batch's output file, in its order."""
    lines = b"".join(queue.content("c", batch["output_file_id"])).splitlines()
    return [json.loads(x)["custom_id"] for x in lines]


async def test_two_hosts_on_one_queue_answer_every_item_exactly_once(redis_server, tmp_path):
    """Two runners run at once on one queue: one leads, the other waits; every item is served
    once and answered once, and either host reads the batch as it ends."""
    store = RedisQueues(redis_server.url, tmp_path / "scratch")
    store.redis.flushall()
    one, two = store.open(), store.open()
    ids = [f"r{i}" for i in range(40)]
    made = make_batch(one, ids, now=int(time.time()))
    served: list[str] = []
    hosts = [runner(one, served, time.time), runner(two, served, time.time)]
    async with trio.open_nursery() as nursery:
        for host in hosts:
            nursery.start_soon(host.run)
        await until(lambda: two.batch("c", made["id"])["status"] == "completed")
        nursery.cancel_scope.cancel()
    done = one.batch("c", made["id"])
    assert done is not None and done["request_counts"] == {"total": 40, "completed": 40,
                                                           "failed": 0}  # fmt: skip
    assert sorted(served) == sorted(ids)  # one leader: nothing served twice
    assert sorted(answered(two, done)) == sorted(ids)
    one.close()
    two.close()


async def test_when_the_leading_host_dies_mid_batch_the_other_takes_over(redis_server, tmp_path):
    """Host A leads and dies with 4 items in flight (its runner cancelled, nothing settled); host
    B can not lead while A's lease holds, takes over once it has run out, takes A's items back and
    answers every item exactly once; A's late answer is not written."""
    store = RedisQueues(redis_server.url, tmp_path / "scratch")
    store.redis.flushall()
    a_queue, b_queue = store.open(), store.open()
    wall = [1_800_000_000.0]
    ids = [f"r{i}" for i in range(12)]
    made = make_batch(a_queue, ids, now=int(wall[0]))
    by_a: list[str] = []
    by_b: list[str] = []
    a = runner(a_queue, by_a, lambda: wall[0], hang=True)
    b = runner(b_queue, by_b, lambda: wall[0])
    async with trio.open_nursery() as dying:
        await a._round(dying)  # leads, takes 4 (its concurrency) and hangs on them
        await until(lambda: len(by_a) == 4)  # each reads its body in a worker thread first
        assert sorted(by_a) == ids[:4]
        async with trio.open_nursery() as nursery:
            assert await b._round(nursery) == LEASE_S / 3  # A's lease holds: B waits
        dying.cancel_scope.cancel()  # A dies: its items stay running in Redis
    assert by_b == [] and store.kept(b_queue)[made["id"]]["running"] == 4
    wall[0] += LEASE_S + 1
    with trio.fail_after(30):
        while (b_queue.batch("c", made["id"]) or {})["status"] != "completed":
            async with trio.open_nursery() as nursery:
                await b._round(nursery)
    assert sorted(by_b) == sorted(ids)  # A's 4 again, and the rest
    done = b_queue.batch("c", made["id"])
    assert done is not None and done["request_counts"]["completed"] == 12
    assert sorted(answered(a_queue, done)) == sorted(ids)
    late = a_queue.take(wall[0], 1)  # nothing left for A to take (and it no longer leads)
    assert late == [] and not a_queue.lead(a._owner, wall[0], LEASE_S)
    a_queue.close()
    b_queue.close()


@pytest.mark.free_lane
async def test_two_sidecars_on_one_redis_serve_one_batch(redis_server):
    """A batch created through one sidecar (state in Redis) is run by whichever leads and read
    through the other: the OpenAI SDK sees one queue; every item is served once."""
    lanes_ = (("free", "free", ["free-model"]),)
    async with (
        open_sidecar(*lanes_, state=redis_server.url, state_namespace="prod") as (one, fakes_one),
        open_sidecar(*lanes_, state=redis_server.url, state_namespace="prod") as (two, fakes_two),
    ):
        first = openai.AsyncOpenAI(base_url=one, api_key="k", max_retries=0)
        second = openai.AsyncOpenAI(base_url=two, api_key="k", max_retries=0)
        raw = jsonl(*(line(f"r{i}").replace('"m"', '"free-model"') for i in range(6)))
        file = await first.files.create(file=("in.jsonl", io.BytesIO(raw)), purpose="batch")
        assert (await second.files.retrieve(file.id)).bytes == len(raw)
        batch = await first.batches.create(
            input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
        )

        async def ended() -> bool:
            return (await second.batches.retrieve(batch.id)).status == "completed"

        await until(ended)
        found = await second.batches.retrieve(batch.id)
        assert "lanes" not in (found.model_extra or {})  # durable
        out = (await second.files.content(found.output_file_id or "")).text.splitlines()
        assert sorted(json.loads(x)["custom_id"] for x in out) == [f"r{i}" for i in range(6)]
        served = len(fakes_one["free"].requests()) + len(fakes_two["free"].requests())
        assert served == 6
        await message_batch_across(one, two)
    keys = store_keys(redis_server.url, "bq:")
    assert keys and all(k.startswith("lanes:{prod}:bq:") for k in keys)


async def message_batch_across(one: str, two: str) -> None:
    """An Anthropic Message Batch created through one sidecar ends and is read, listed and
    deleted through the other."""
    import anthropic

    first = anthropic.AsyncAnthropic(base_url=one[:-3], api_key="k", max_retries=0)
    second = anthropic.AsyncAnthropic(base_url=two[:-3], api_key="k", max_retries=0)
    ask: Any = {
        "model": "free-model",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "x"}],
    }
    made = await first.messages.batches.create(
        requests=[{"custom_id": f"m{i}", "params": ask} for i in range(3)]
    )

    async def ended() -> bool:
        return (await second.messages.batches.retrieve(made.id)).processing_status == "ended"

    await until(ended)
    found = {
        r.custom_id: r.result.type async for r in await second.messages.batches.results(made.id)
    }
    assert found == {"m0": "succeeded", "m1": "succeeded", "m2": "succeeded"}
    assert [x.id async for x in second.messages.batches.list()] == [made.id]
    assert (await second.messages.batches.delete(made.id)).type == "message_batch_deleted"
    assert [x.id async for x in first.messages.batches.list()] == []


def store_keys(url: str, part: str) -> list[str]:
    import redis

    return [k for k in redis.Redis.from_url(url, decode_responses=True).scan_iter() if part in k]


def test_the_queues_keys_carry_the_namespace_and_no_expiry(redis_server, tmp_path):
    """Two deployments on one server share nothing; after a batch has run and ended (and one was
    made from bad lines), no key of the queue has an expiry an eviction policy could take."""
    prod = RedisQueues(redis_server.url, tmp_path / "p", namespace="prod")
    prod.redis.flushall()
    test = RedisQueues(redis_server.url, tmp_path / "t", namespace="test")
    queue, other = prod.open(), test.open()
    made = make_batch(queue, ["a", "b"])
    make_batch(queue, ["x", "x"])  # failed: its staged items are gone
    assert other.batch("c", made["id"]) is None and other.files("c", 10, None) == []
    assert queue.lead("me", 1000.0, 15.0) and other.take(1000.0, 5) == []
    for item in queue.take(1000.0, 5):
        queue.finish(item, ok=True, line=b"{}\n")
    assert queue.settle(1001.0) == [made["id"]]
    keys = store_keys(redis_server.url, ":")
    assert keys and all(k.startswith("lanes:{prod}:bq:") for k in keys)
    assert [k for k in keys if prod.redis.ttl(k) != -1] == []
    assert not any(":ids:" in k for k in keys)  # the custom_ids checked at creation: gone
    assert queue.evicting() == ""
    prod.redis.config_set("maxmemory-policy", "allkeys-lru")
    assert "allkeys-lru" in queue.evicting() and "noeviction" in queue.evicting()
    queue.close()
    other.close()


def test_a_redis_rolled_back_under_its_leader_ends_its_batch(redis_server, tmp_path):
    """Hostile review: a Redis restarted from an older snapshot (or a replica promoted behind its
    primary) gave back as running an item its leader had answered; the leader kept its lease,
    took nothing back, and the batch never ended — not even at its window's end. A leader takes
    back what it holds running and does not run."""
    store = RedisQueues(redis_server.url, tmp_path / "scratch")
    store.redis.flushall()
    queue = store.open()
    made = make_batch(queue, ["a"], now=1000, window="1h")
    assert queue.lead("me", 1000.0, LEASE_S)
    [item] = queue.take(1000.0, 1)
    store.redis.save()  # the snapshot it comes back from
    queue.finish(item, ok=True, line=b"{}\n")
    redis_server.kill()
    redis_server.start()
    assert queue.lead("me", 1005.0, LEASE_S, running=())  # it runs nothing now
    [again] = queue.take(1005.0, 1)  # taken back, and run again
    queue.finish(again, ok=True, line=b"{}\n")
    assert queue.settle(1006.0) == [made["id"]]
    queue.close()


async def test_an_item_ending_while_redis_is_down_does_not_end_the_runner(redis_server, tmp_path):
    """Hostile review: an item that ended while Redis was down — its answer not written, its
    put-back not either — raised out of the runner, whose nursery is the sidecar's: a Redis
    blip took the whole sidecar down, interactive work with it. The item stays running (a
    leader takes it back) and the runner goes on."""
    store = RedisQueues(redis_server.url, tmp_path / "scratch")
    store.redis.flushall()
    queue = store.open()
    made = make_batch(queue, ["a"], now=int(time.time()))
    began, release = trio.Event(), trio.Event()

    async def serve(endpoint: str, body: bytes, client: str, deadline_s: float,
                    paid_cap: float | None = None) -> ItemAnswer:  # fmt: skip
        began.set()
        await release.wait()
        return ItemAnswer(200, b"{}", "r")

    host = BatchRunner(queue, serve, now_wall=time.time, health=Background().task("batches"))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(host.run)
        with trio.fail_after(30):
            await began.wait()
        store.redis.save()  # Redis comes back with the item running
        redis_server.kill()
        release.set()
        await trio.sleep(0.5)  # its answer and its put-back fail
        redis_server.start()
        host.wake()
        await until(lambda: (queue.batch("c", made["id"]) or {}).get("status") == "completed")
        nursery.cancel_scope.cancel()
    queue.close()


def test_a_holder_of_another_pid_namespace_is_never_taken_for_gone():
    """Hostile review: a lease holder was taken for gone when its host name was this host's and
    its pid not running here — but two containers may share a host name (host networking) and
    never a PID namespace: each took the lease from the other every round, taking back the
    other's running items (run again) and counting its paid try spent in full."""
    import os
    import socket
    import subprocess
    import sys

    from lanes._core.batch.runner import gone, host

    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    dead = int(ended.stdout)
    name = socket.gethostname()
    assert not gone(f"{name}:{dead}:abcd")  # a holder of a lanes before this one: not known
    assert not gone(f"{name}/1:{dead}:abcd")  # another PID namespace's
    assert gone(f"{host()}:{dead}:abcd")  # of this namespace, not running: gone
    assert not gone(f"{host()}:{os.getpid()}:abcd")  # running

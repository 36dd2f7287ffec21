"""The FreeTierManager in the dispatcher, over loopback fakes: herds, parking, restarts, sharing."""

from __future__ import annotations

import os
import sys
import textwrap

import attrs
import pytest
import trio

import lanes
from helpers import ENGINE_POLICY, config, free_lane, paid_lane
from lanes._core.model.statuses import http_status
from lanes.testing import answer, open_fake, rate_limited

JOB = [{"role": "user", "content": "hi"}]
pytestmark = pytest.mark.free_lane


def job(**kw) -> lanes.Job:
    return lanes.Job(messages=JOB, **kw)


@pytest.mark.slow
async def test_herd_sends_one_request_per_backoff_window(env, autojump_clock):
    """200 concurrent jobs against a 429 + Retry-After: 5 fake: one request per window, no more."""
    async with (
        open_fake("free", models=("free-model",)) as free,
        open_fake("paid", models=("paid-model",)) as paid,
    ):
        free.script("free-model", rate_limited(retry_after=5))
        cfg = config(free_lane("free", free.base_url), paid_lane("paid", paid.base_url))
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
            served = []

            async def one() -> None:
                served.append((await dispatcher.complete(job(deadline_s=10))).lane)

            for _ in range(3):  # three waves, each inside a different backoff window
                async with trio.open_nursery() as nursery:
                    for _ in range(200):
                        nursery.start_soon(one)
                await trio.sleep(6)
    times = [r.at for r in free.requests()]
    assert len(times) == 3, times  # one per window, across 600 jobs
    assert all(b - a >= 5 for a, b in zip(times, times[1:], strict=False))
    assert served.count("paid") == 600


async def test_exhausted_free_capacity_says_when_it_reopens(env, autojump_clock):
    """No paid lane: the herd gets FreeTierExhausted with the exact wait and the model's name."""
    async with open_fake("free", models=("free-model",)) as free:
        free.script("free-model", rate_limited(retry_after=20))
        async with lanes.open_dispatcher(
            config(free_lane("free", free.base_url)), env=env
        ) as dispatcher:
            errors = []

            async def one() -> None:
                try:
                    await dispatcher.complete(job())
                except lanes.FreeTierExhausted as exc:
                    errors.append(exc)

            async with trio.open_nursery() as nursery:
                for _ in range(50):
                    nursery.start_soon(one)
    assert len(errors) == 50 and len(free.requests()) == 1
    assert all(e.next_eligible == "free/free-model" for e in errors)
    assert all(e.retry_after_s is not None and 20 <= e.retry_after_s <= 22.1 for e in errors)
    assert all(http_status(e) == 429 and e.code == "free_tier_exhausted" for e in errors)


async def test_remaining_zero_stops_requests_before_any_429(env, autojump_clock):
    """A 200 with `remaining: 0` parks the model: the next jobs go elsewhere until the reset."""
    async with (
        open_fake("free", models=("free-model",)) as free,
        open_fake("paid", models=("paid-model",)) as paid,
    ):
        last = answer(
            headers={"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "30s"}
        )
        free.script(
            "free-model", answer(headers={"x-ratelimit-remaining-requests": "1"}), last, answer()
        )
        cfg = config(free_lane("free", free.base_url), paid_lane("paid", paid.base_url))
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
            lanes_used = [(await dispatcher.complete(job())).lane for _ in range(5)]
            await trio.sleep(34)  # past the reset plus the largest jitter (10 % + 0.05 s)
            after = (await dispatcher.complete(job())).lane
    assert lanes_used == ["free", "free", "paid", "paid", "paid"]
    assert after == "free"
    assert [r.behaviour for r in free.requests()] == ["answer"] * 3  # never a 429


async def test_counters_survive_a_restart(env, tmp_path, autojump_clock):
    """Usage counted before a restart still counts after it: rpm=3 holds across two openings."""
    state = str(tmp_path / "lanes.db")
    async with (
        open_fake("free", models=("free-model",)) as free,
        open_fake("paid", models=("paid-model",)) as paid,
    ):
        cfg = config(
            free_lane("free", free.base_url, free_tier={"kind": "rate_limited", "rpd": 3}),
            paid_lane("paid", paid.base_url),
            state=state,
        )
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
            first = [(await dispatcher.complete(job())).lane for _ in range(2)]
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
            second = [(await dispatcher.complete(job())).lane for _ in range(2)]
    assert first == ["free", "free"] and second == ["free", "paid"]
    assert len(free.requests()) == 3


async def test_backoff_survives_in_the_shared_file(env, tmp_path, autojump_clock):
    """A backoff written by one dispatcher is honoured by another opening the same file."""
    state = str(tmp_path / "lanes.db")
    async with (
        open_fake("free", models=("free-model",)) as free,
        open_fake("paid", models=("paid-model",)) as paid,
    ):
        free.script("free-model", rate_limited(retry_after=60), answer())
        cfg = config(
            free_lane("free", free.base_url), paid_lane("paid", paid.base_url), state=state
        )
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
            assert (await dispatcher.complete(job())).lane == "paid"
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
            reply = await dispatcher.complete(job())
    assert reply.lane == "paid" and "backoff" in reply.skips[0].reason
    assert len(free.requests()) == 1


CHILD = textwrap.dedent("""
    import sys, trio, lanes
    sys.path.insert(0, {tests!r})
    from helpers import config, free_lane
    async def main():
        cfg = config(free_lane("free", {url!r}), state={state!r})
        async with lanes.open_dispatcher(cfg, env={{"FREE_API_KEY": "k-0123456789"}}) as d:
            try:
                await d.complete(lanes.Job(messages=[{{"role": "user", "content": "hi"}}]))
            except lanes.FreeTierExhausted:
                print("backed off")
    trio.run(main)
""")


@pytest.mark.slow
async def test_two_processes_share_one_state_file(env, tmp_path):
    """Another process hits the 429; this one, already running, skips the model within a second."""
    state = str(tmp_path / "lanes.db")
    tests_dir = os.path.dirname(__file__)
    async with (
        open_fake("free", models=("free-model",)) as free,
        open_fake("paid", models=("paid-model",)) as paid,
    ):
        free.script("free-model", rate_limited(retry_after=120))
        cfg = config(
            free_lane("free", free.base_url), paid_lane("paid", paid.base_url), state=state
        )
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
            script = CHILD.format(tests=tests_dir, url=free.base_url, state=state)
            result = await trio.run_process(
                [sys.executable, "-c", script], capture_stdout=True, capture_stderr=True
            )
            assert result.stdout.decode().strip() == "backed off", result.stderr.decode()
            await trio.sleep(1.0)  # one sync interval and then some
            reply = await dispatcher.complete(job())
    assert reply.lane == "paid" and "backoff" in reply.skips[0].reason
    assert len(free.requests()) == 1  # only the other process's request ever reached it


async def test_provider_balance_beats_the_local_estimate(env, autojump_clock):
    """A credit lane estimated spent is served again once its balance endpoint says otherwise."""
    async with (
        open_fake("credit", models=("free-model",)) as credit,
        open_fake("paid", models=("paid-model",)) as paid,
    ):
        kind = {
            "kind": "credits",
            "budget_usd": 0.000001,
            "detection": "custom",
            "endpoint": {"url": "{base_url}/key", "json_path": "data.limit_remaining"},
        }
        lane_table = free_lane("credit", credit.base_url, free_tier=kind, balance_poll_s=60)
        lane_table["models"] = [
            {"id": "free-model", "input_usd_per_mtok": 1.0, "output_usd_per_mtok": 1.0}
        ]
        cfg = config(lane_table, paid_lane("paid", paid.base_url))
        credit.balance = 0.0
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
            await trio.sleep(1)
            assert dispatcher.manager.credit_left("credit", dispatcher.now_wall()) == 0.0
            assert (await dispatcher.complete(job())).lane == "paid"
            credit.balance = 4.5
            await trio.sleep(60)
            assert dispatcher.manager.credit_left("credit", dispatcher.now_wall()) == 4.5
            assert (await dispatcher.complete(job())).lane == "credit"
    assert [r.authorization for r in credit.requests() if r.behaviour == "key"] == [True, True]


async def test_a_job_that_may_wait_is_served_free_after_the_reset_not_paid(env, autojump_clock):
    """X-Lanes-Max-Wait (`Job.max_wait_s`): the free model answers 429 with Retry-After 20, and a
    paid fallback is allowed. A job that may wait 60 s waits for the reset and is served free;
    one that may wait 10 s (less than the reset) goes to paid, as without the header; one without
    it is unchanged."""
    async with (
        open_fake("free", models=("free-model",)) as free,
        open_fake("paid", models=("paid-model",)) as paid,
    ):
        free.script(
            "free-model", rate_limited(retry_after=20), answer(), rate_limited(retry_after=20)
        )
        cfg = config(free_lane("free", free.base_url), paid_lane("paid", paid.base_url))
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
            start = trio.current_time()
            waited = await dispatcher.complete(attrs.evolve(job(), max_wait_s=60.0))
            took = trio.current_time() - start
            short = await dispatcher.complete(attrs.evolve(job(), max_wait_s=10.0))
            plain = await dispatcher.complete(job())
    assert waited.lane == "free" and 20 <= took <= 23
    assert (short.lane, plain.lane) == ("paid", "paid")
    assert len(paid.requests()) == 2 and len(free.requests()) == 3  # 429, the answer, 429


async def test_a_wait_longer_than_the_deadline_is_not_waited(env, autojump_clock):
    """A wait never outlasts the job's deadline: the quota reopens after it, so the job answers
    the exact 429 at once, as without the header."""
    async with open_fake("free", models=("free-model",)) as free:
        free.script("free-model", rate_limited(retry_after=20))
        cfg = config(free_lane("free", free.base_url))
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
            start = trio.current_time()
            with pytest.raises(lanes.FreeTierExhausted) as refused:
                await dispatcher.complete(attrs.evolve(job(deadline_s=5), max_wait_s=60.0))
            assert trio.current_time() - start < 1.0
    assert refused.value.retry_after_s is not None and refused.value.retry_after_s >= 19


async def test_a_full_waiting_room_answers_the_exact_429_and_places_are_given_back(
    env, autojump_clock
):
    """One place per client (`waiting_per_client = 1`): a's first job waits and is served free
    after the reset; a's second, meanwhile, is answered at once with the exact 429 as without
    the header; b's waits in its own place. A job whose client left gives its place back."""
    async with open_fake("free", models=("free-model",)) as free:
        free.script("free-model", rate_limited(retry_after=20), answer(), answer())
        policy = {**ENGINE_POLICY, "waiting_per_client": 1}
        cfg = config(free_lane("free", free.base_url), policy=policy)
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
            with pytest.raises(lanes.FreeTierExhausted):  # the 429 that starts the backoff
                await dispatcher.complete(job(client="a"))
            room = dispatcher.waiting
            served: list[str] = []

            async def waits(client: str) -> None:
                reply = await dispatcher.complete(job(client=client, max_wait_s=60.0))
                served.append(f"{client}:{reply.lane}")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(waits, "a")
                nursery.start_soon(waits, "b")
                await trio.sleep(1)
                assert room.waiting == 2
                start = trio.current_time()
                with pytest.raises(lanes.FreeTierExhausted) as full:
                    await dispatcher.complete(job(client="a", max_wait_s=60.0))
                assert trio.current_time() == start  # at once
                with pytest.raises(lanes.FreeTierExhausted) as plain:  # without the header
                    await dispatcher.complete(job(client="d"))
                assert full.value.retry_after_s == plain.value.retry_after_s
                assert 18 <= (full.value.retry_after_s or 0) <= 23
            assert sorted(served) == ["a:free", "b:free"] and room.waiting == 0
            free.script("free-model", rate_limited(retry_after=20))
            with pytest.raises(lanes.FreeTierExhausted):
                await dispatcher.complete(job(client="c"))
            with trio.move_on_after(5):  # the client leaves while its job waits
                await dispatcher.complete(job(client="c", max_wait_s=60.0))
            assert room.waiting == 0


async def test_jobs_due_at_once_start_in_turns_across_clients(autojump_clock):
    """Four jobs whose quota reopens at the same moment start again in turns: every client's
    earliest deadline first (a's 5, then b's 30), then a's next (10, then 20)."""
    from lanes._core.engine.waiting import WaitingRoom
    from lanes._core.policy.policy import PolicyConfig

    room = WaitingRoom(lambda: PolicyConfig())
    started: list[str] = []

    reopens = trio.current_time() + 7.0

    async def one(name: str, client: str, deadline: float) -> None:
        with room.place(client, deadline, 10) as ticket:
            await room.wait(ticket, reopens - trio.current_time())
            started.append(name)
            await trio.sleep(1)  # its walk; the next start does not wait for it to end

    async with trio.open_nursery() as nursery:
        for name, client, deadline in (("a10", "a", 10), ("a20", "a", 20), ("a5", "a", 5),
                                       ("b30", "b", 30)):  # fmt: skip
            nursery.start_soon(one, name, client, deadline)
            await trio.sleep(0.1)
    assert started == ["a5", "b30", "a10", "a20"]


def test_the_waiting_room_refuses_past_its_caps():
    from lanes._core.engine.waiting import RoomFull, WaitingRoom
    from lanes._core.policy.policy import PolicyConfig

    room = WaitingRoom(lambda: PolicyConfig(waiting_jobs=2, waiting_mb=0.001))
    with room.place("a", 1.0, 400), room.place("b", 1.0, 400):
        with pytest.raises(RoomFull):
            room.place("c", 1.0, 1).__enter__()  # two jobs wait: the total cap
        assert room.waiting == 2
    with room.place("a", 1.0, 900), pytest.raises(RoomFull):
        room.place("b", 1.0, 200).__enter__()  # 1,100 bytes > 1,000
    assert room.waiting == 0

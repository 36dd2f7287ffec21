"""A library batch's budget and put-back under attack: the breaks a hostile review found
(2026-12-04), each held now — a fault in the paid try ends its job only, no paid attempt after a
cancel or with under 5 s of the window left, the caller's own free_only and paid cap kept, jobs held
by a refusal pay when free capacity can not make the window, a hold keyed by what serves a job,
batch jobs never in the interactive waiting room, and beside a batch one refusal costs an
interactive job no more than one free attempt."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from decimal import Decimal
from typing import Any

import attrs
import pytest
import trio

import lanes
from helpers import ENGINE_POLICY, config, free_lane, paid_lane
from lanes._core.batch.library import LibraryBatch
from lanes._core.engine.backlog import Backlog
from lanes._core.model.errors import FreeTierExhausted
from lanes.testing import answer, open_fake, rate_limited, status

pytestmark = pytest.mark.free_lane

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


def jobs(n: int, **kw: Any) -> list[lanes.Job]:
    return [lanes.Job(messages=[{"role": "user", "content": f"item {i}"}], **kw) for i in range(n)]


def capped(n: int, **kw: Any) -> list[lanes.Job]:
    return jobs(n, params={"max_tokens": 50}, **kw)


@asynccontextmanager
async def cooling_pair() -> AsyncIterator[tuple[Any, Any]]:
    """A free fake whose model answers 429, Retry-After 2 h (past any window here), and a paid
    one."""
    async with (
        open_fake("free", models=("free-model",)) as free,
        open_fake("paid", models=("paid-model",)) as paid,
    ):
        free.script("free-model", *[rate_limited(retry_after=7200)] * 20)
        yield free, paid


def cfg_of(free: object, paid: object, **policy: object) -> lanes.Config:
    return config(free_lane("free", free.base_url), paid_lane("paid", paid.base_url),  # type: ignore[attr-defined]
                  policy={**ENGINE_POLICY, **policy})  # fmt: skip


def reply() -> lanes.Reply:
    return lanes.Reply(body={"choices": []}, lane="f", provider="p", model="m", route="primary")


async def test_a_fault_in_the_paid_try_ends_its_job_only(autojump_clock):
    """Job 0 is told "not before 10,000 s" (past the window) and its paid serve raises a bug of
    ours; job 1, a slow free job, is still answered."""

    async def serve(job: lanes.Job) -> lanes.Reply:
        if "item 1" in str(job.messages):
            await trio.sleep(20)
            return reply()
        if job.free_only:
            raise FreeTierExhausted("x", retry_after_s=10_000)
        raise RuntimeError("a bug of ours in the paid try")

    batch = LibraryBatch(jobs(2), serve, window_s=600, headroom=0.2, concurrency=2,
                         interactive_waiting=lambda: 0, backlog=Backlog(0.2),
                         max_paid_usd=1.0)  # fmt: skip
    async with trio.open_nursery() as nursery:
        nursery.start_soon(batch.run)
        got = {r.index: r async for r in batch.results()}
    assert got[1].reply is not None and isinstance(got[0].error, lanes.JobFailed)
    assert batch.progress.paid_usd == 1.0  # its end unseen: all it held counts


@pytest.mark.parametrize("budget", [Decimal("0.50"), 0.5, 1])
async def test_a_budget_is_any_number_of_dollars(env, autojump_clock, budget):
    async with (
        cooling_pair() as (free, paid),
        lanes.open_dispatcher(cfg_of(free, paid), env=env) as dispatcher,
        dispatcher.submit_batch(capped(3), window=600, max_paid_usd=budget) as batch,
    ):
        results = [r async for r in batch.results()]
    assert all(r.reply is not None for r in results) and len(paid.requests()) == 3
    assert 0 < batch.progress.paid_usd <= float(budget)


@pytest.mark.parametrize("bad", [True, "lots", None, 10**400, math.inf, -0.01])
async def test_a_budget_that_is_not_dollars_is_refused(env, autojump_clock, bad):
    async with open_fake("free", models=("free-model",)) as free:
        cfg = config(free_lane("free", free.base_url))
        with pytest.raises(ValueError, match="max_paid_usd"):
            async with (
                lanes.open_dispatcher(cfg, env=env) as dispatcher,
                dispatcher.submit_batch(capped(1), max_paid_usd=bad),
            ):
                pass


async def test_jobs_held_behind_a_refusal_past_the_window_still_pay(env, autojump_clock):
    """Concurrency 1: the first job's refusal (Retry-After past the window) does not hold the
    other two back until the window's end — all three are paid."""
    async with (
        cooling_pair() as (free, paid),
        lanes.open_dispatcher(cfg_of(free, paid), env=env) as dispatcher,
        dispatcher.submit_batch(capped(3), window=600, max_paid_usd=1.0, concurrency=1) as b,
    ):
        results = [r async for r in b.results()]
    assert len(paid.requests()) == 3 and all(r.reply is not None for r in results)


@pytest.mark.parametrize("own", [{"free_only": True}, {"paid_cap_usd": 1e-9}])
async def test_the_callers_free_only_and_paid_cap_hold(env, autojump_clock, own):
    async with (
        cooling_pair() as (free, paid),
        lanes.open_dispatcher(cfg_of(free, paid), env=env) as dispatcher,
        dispatcher.submit_batch(capped(1, **own), window=600, max_paid_usd=1.0) as batch,
    ):
        [result] = [r async for r in batch.results()]
    assert paid.requests() == [] and result.error is not None


async def test_no_paid_attempt_after_a_cancel(env, autojump_clock):
    """paid_attempts 2; the first paid request answers 500 after 10 s; cancel() at 5 s cuts the
    try: no second paid request, and what it held counts spent."""
    async with cooling_pair() as (free, paid):
        paid.script("paid-model", attrs.evolve(status(500), delay_s=10), answer())
        async with lanes.open_dispatcher(cfg_of(free, paid, paid_attempts=2), env=env) as d:
            async with d.submit_batch(capped(1), window=600, max_paid_usd=1.0) as batch:
                await trio.sleep(5)
                batch.cancel()
                [result] = [r async for r in batch.results()]
            await trio.sleep(30)
    assert len(paid.requests()) == 1 and isinstance(result.error, lanes.BatchCancelled)
    assert batch.progress.paid_usd == 1.0


async def test_no_paid_attempt_with_under_5_s_of_the_window_left(env, autojump_clock):
    """The job reaches its paid try with 15 s left; the first paid request answers 500 after
    12 s: no retry goes out with 3 s left."""
    async with (
        open_fake("free", models=("free-model",)) as free,
        open_fake("paid", models=("paid-model",)) as paid,
    ):
        free.script("free-model", attrs.evolve(rate_limited(retry_after=7200), delay_s=585),
                    *[rate_limited(retry_after=7200)] * 20)  # fmt: skip
        paid.script("paid-model", attrs.evolve(status(500), delay_s=12), answer())
        cfg = config(free_lane("free", free.base_url, attempt_timeout_s=1000),
                     paid_lane("paid", paid.base_url),
                     policy={**ENGINE_POLICY, "paid_attempts": 2})  # fmt: skip
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
            start = trio.current_time()
            async with dispatcher.submit_batch(capped(1), window=600, max_paid_usd=1.0) as batch:
                [result] = [r async for r in batch.results()]
    left = [start + 600 - r.at for r in paid.requests()]
    assert len(left) == 1 and left[0] >= 5 and result.error is not None


async def test_a_refusal_holds_back_only_jobs_served_alike(env, autojump_clock):
    """Only lane t takes tools and it is cooling for 3,000 s; a job without tools, which lane n
    serves, is not held back by the tool job's refusal."""
    async with (
        open_fake("t", models=("free-model",)) as t,
        open_fake("n", models=("free-model",)) as n,
    ):
        t.script("free-model", *[rate_limited(retry_after=3000)] * 5)
        no_tools = free_lane("n", n.base_url) | {"models": [{"id": "free-model", "tools": False}]}
        cfg = config(free_lane("t", t.base_url), no_tools)
        both = [lanes.Job(messages=[{"role": "user", "content": "a"}], model="free-model",
                          params={"tools": TOOLS}),
                lanes.Job(messages=[{"role": "user", "content": "b"}],
                          model="free-model")]  # fmt: skip
        async with (
            lanes.open_dispatcher(cfg, env=env) as dispatcher,
            dispatcher.submit_batch(both, window=600, concurrency=1) as batch,
        ):
            results = {r.index: r async for r in batch.results()}
    assert results[1].reply is not None and results[1].reply.lane == "n"


async def test_batch_jobs_never_wait_in_the_interactive_waiting_room(env, autojump_clock):
    """Jobs the caller made with max_wait_s are the batch's: the room holds none of them, and an
    interactive job that asks to wait finds a place."""
    async with open_fake("free", models=("free-model",)) as free:
        free.script("free-model", rate_limited(retry_after=50), *[answer()] * 20)
        cfg = config(free_lane("free", free.base_url),
                     policy={**ENGINE_POLICY, "waiting_per_client": 2})  # fmt: skip
        async with (
            lanes.open_dispatcher(cfg, env=env) as dispatcher,
            dispatcher.submit_batch(jobs(6, max_wait_s=600.0), window="1h", concurrency=2) as batch,
        ):
            await trio.sleep(5)
            room = dispatcher.waiting.waiting
            served = await dispatcher.complete(jobs(1, max_wait_s=600.0)[0])
    assert room == 0 and served.lane == "free" and batch.progress.completed == 6


async def test_beside_a_batch_one_refusing_quota_costs_one_free_attempt(env, autojump_clock):
    """Lanes a (rpd 1000), then x and y (rpd 10, 8 used: nothing left to batches) whose providers
    refuse (their key is used elsewhere). Beside a batch only x moves to the front: its 429 costs
    one free attempt, and a serves the job free."""

    def rpd(n: int) -> dict[str, object]:
        return {"kind": "rate_limited", "rpd": n}

    async with (
        open_fake("a", models=("free-model",)) as a,
        open_fake("x", models=("free-model",)) as x,
        open_fake("y", models=("free-model",)) as y,
        open_fake("paid", models=("paid-model",)) as paid,
    ):
        cfg = config(free_lane("a", a.base_url, free_tier=rpd(1000)),
                     free_lane("x", x.base_url, free_tier=rpd(10)),
                     free_lane("y", y.base_url, free_tier=rpd(10)),
                     paid_lane("paid", paid.base_url))  # fmt: skip
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
            for name, fake in (("x", x), ("y", y)):
                for job in jobs(8, model=f"{name}/free-model"):
                    await dispatcher.complete(job)
                fake.script("free-model", *[rate_limited(retry_after=3600)] * 5)
            dispatcher.work_left.left("test", 10)
            served = await dispatcher.complete(capped(1, model="free-model")[0])
    assert served.lane == "a" and served.route != "paid_fallback"
    assert len(x.requests()) == 9 and len(y.requests()) == 8  # x tried once beside the batch


@pytest.mark.parametrize("retry_after", [None, 0.0, -5.0, math.nan, 1e-9])
async def test_a_refusal_without_a_sane_retry_after_does_not_spin(autojump_clock, retry_after):
    """Twenty jobs always told "not now": at most `concurrency` tries an instant while the
    window runs, each job ended by it."""
    calls: list[float] = []

    async def serve(job: lanes.Job) -> lanes.Reply:
        calls.append(trio.current_time())
        raise FreeTierExhausted("x", retry_after_s=retry_after)

    backlog = Backlog(0.2)
    batch = LibraryBatch(jobs(20, model="m"), serve, window_s=30, headroom=0.2, concurrency=4,
                         interactive_waiting=lambda: 0, backlog=backlog)  # fmt: skip
    async with trio.open_nursery() as nursery:
        nursery.start_soon(batch.run)
        results = [r async for r in batch.results()]
    per_second: dict[int, int] = {}
    for at in calls:
        per_second[int(at)] = per_second.get(int(at), 0) + 1
    assert max(per_second.values()) <= 4 and len(results) == 20 and backlog.items == 0

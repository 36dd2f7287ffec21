"""Work that can wait from the library: `dispatcher.submit_batch(jobs, window=...)` over loopback
fakes, on the virtual clock — served free as quotas reopen, never paid, ended by its window or a
cancel, the headroom left to interactive work, each job's result given once."""

from __future__ import annotations

from datetime import UTC, datetime

import attrs
import pytest
import trio

import lanes
from helpers import ENGINE_POLICY, config, free_lane, paid_lane
from lanes.testing import answer, open_fake, quota, rate_limited

pytestmark = pytest.mark.free_lane
MORNING = datetime(2026, 12, 4, 8, 0, tzinfo=UTC).timestamp()  # no UTC midnight within hours


def jobs(n: int, **kw) -> list[lanes.Job]:
    return [lanes.Job(messages=[{"role": "user", "content": f"item {i}"}], **kw) for i in range(n)]


async def test_a_cooling_quota_is_waited_for_and_nothing_is_paid(env, autojump_clock):
    """The free model answers 429 (Retry-After 120) once; a paid lane is allowed. Every job is
    served free after the reset, one result each, in the order they end; paid is never asked."""
    async with (
        open_fake("free", models=("free-model",)) as free,
        open_fake("paid", models=("paid-model",)) as paid,
    ):
        free.script("free-model", rate_limited(retry_after=120), answer())
        cfg = config(free_lane("free", free.base_url), paid_lane("paid", paid.base_url))
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
            start = trio.current_time()
            async with dispatcher.submit_batch(jobs(3), window="1h") as batch:
                results = [r async for r in batch.results()]
            took = trio.current_time() - start
            assert (batch.progress.completed, batch.progress.failed) == (3, 0)
    assert sorted(r.index for r in results) == [0, 1, 2]
    assert all(r.reply is not None and r.reply.lane == "free" for r in results)
    assert 120 <= took < 300
    assert paid.requests() == []


async def test_what_the_window_does_not_serve_expires(env, autojump_clock):
    """Free capacity does not come back within the 10-minute window: every job ends
    `batch_expired` at the window's end, and nothing was paid."""
    async with (
        open_fake("free", models=("free-model",)) as free,
        open_fake("paid", models=("paid-model",)) as paid,
    ):
        free.script("free-model", rate_limited(retry_after=3000))
        cfg = config(free_lane("free", free.base_url), paid_lane("paid", paid.base_url))
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
            start = trio.current_time()
            async with dispatcher.submit_batch(jobs(4), window=600) as batch:
                results = [r async for r in batch.results()]
            took = trio.current_time() - start
    assert sorted(r.index for r in results) == [0, 1, 2, 3]
    assert all(isinstance(r.error, lanes.BatchExpired) for r in results)
    assert 600 <= took < 602 and batch.progress.failed == 4
    assert paid.requests() == [] and len(free.requests()) == 1


async def test_a_cancel_ends_what_has_not_started(env, autojump_clock):
    async with open_fake("free", models=("free-model",)) as free:
        free.script("free-model", rate_limited(retry_after=100))
        cfg = config(free_lane("free", free.base_url))
        async with (
            lanes.open_dispatcher(cfg, env=env) as dispatcher,
            dispatcher.submit_batch(jobs(5), window="1h") as batch,
        ):
            await trio.sleep(10)
            assert batch.progress.remaining == 5
            batch.cancel()
            results = [r async for r in batch.results()]
    assert len(results) == 5 and all(isinstance(r.error, lanes.BatchCancelled) for r in results)


async def test_the_headroom_is_left_to_interactive_work(env, autojump_clock):
    """rpd = 10, the default headroom 0.2: the batch serves 8 and the rest wait for the next UTC
    day (past its 1-hour window: expired); an interactive job is still served free. The world
    opens at 08:00 UTC: from the host's own time, after 23:00 the day would reset within the
    window and serve the other 2 (it did, on CI at 23:00)."""
    async with open_fake("free", models=("free-model",)) as free:
        rpd = {"kind": "rate_limited", "rpd": 10}
        cfg = config(free_lane("free", free.base_url, free_tier=rpd))
        async with lanes.open_dispatcher(cfg, env=env, epoch_now=MORNING) as dispatcher:
            async with dispatcher.submit_batch(jobs(10), window="1h", concurrency=1) as batch:
                await trio.sleep(600)  # the virtual clock: 8 served within seconds
                assert batch.progress.completed == 8 and len(free.requests()) == 8
                reply = await dispatcher.complete(jobs(1)[0])
                assert reply.lane == "free"
            assert batch.progress.completed == 8 and batch.progress.failed == 2


@pytest.mark.parametrize("delay_s", [0.0, 2.5])
async def test_the_headroom_holds_with_jobs_in_flight_on_a_quota_only_its_headers_tell(
    env, autojump_clock, delay_s
):
    """8 requests a minute that only the provider's headers tell, 4 jobs at once (answered at
    once, or after 2.5 s): the batch starts at most the 6 the 0.2 headroom leaves in any minute
    — the requests its answers have not reported on count — and none is refused."""
    async with open_fake("free", models=("free-model",)) as free:
        free.script("free-model", quota(8, style="openai", delay_s=delay_s))
        cfg = config(free_lane("free", free.base_url))  # no rpm in config
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
            start = trio.current_time()
            async with dispatcher.submit_batch(jobs(24), window="1h", concurrency=4) as batch:
                results = [r async for r in batch.results()]
            took = trio.current_time() - start
    assert all(r.reply is not None for r in results) and len(results) == 24
    assert len(free.requests()) == 24  # none refused (a 429 is tried again)
    per_minute: dict[int, int] = {}
    for r in free.requests():  # the fake counts a request when it answers it
        minute = int((r.at + delay_s) // 60)
        per_minute[minute] = per_minute.get(minute, 0) + 1
    assert max(per_minute.values()) == 6 and took < 5 * 60


async def test_no_job_starts_while_interactive_work_waits(env, autojump_clock):
    """An interactive job waits for the free quota (X-Lanes-Max-Wait): the batch starts nothing
    until it has gone, then its jobs are served."""
    async with open_fake("free", models=("free-model",)) as free:
        free.script("free-model", rate_limited(retry_after=30), answer())
        cfg = config(free_lane("free", free.base_url))
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
            with pytest.raises(lanes.FreeTierExhausted):
                await dispatcher.complete(jobs(1)[0])
            async with trio.open_nursery() as nursery:
                waiter = attrs.evolve(jobs(1)[0], max_wait_s=60.0)
                nursery.start_soon(dispatcher.complete, waiter)
                await trio.sleep(1)
                assert dispatcher.waiting.waiting == 1
                async with dispatcher.submit_batch(jobs(2), window="1h") as batch:
                    await trio.sleep(20)
                    assert len(free.requests()) == 1  # only the first 429: nothing started
                    results = [r async for r in batch.results()]
    assert [r.reply is not None for r in results] == [True, True]
    bodies = [r.body for r in free.requests()]
    assert len(bodies) == 4


def test_a_window_is_text_or_seconds_within_seven_days():
    from lanes._core.batch.library import window_of

    assert window_of("24h") == 86400 and window_of(90) == 90.0
    for bad in (0, -1, float("nan"), 8 * 86400, "2w", True and "x"):
        with pytest.raises(ValueError):
            window_of(bad)


async def test_the_audit_and_the_report_split_batch_from_interactive_work(
    env, tmp_path, autojump_clock
):
    """A batch's jobs are audited with `work` = batch, the others interactive; `--by work`
    reports each apart (and a client's own report too)."""
    from lanes._core.audit.report import report

    async with open_fake("free", models=("free-model",)) as free:
        cfg = config(free_lane("free", free.base_url), state=str(tmp_path / "s.db"))
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
            async with dispatcher.submit_batch(jobs(3, client="ci"), window="1h") as batch:
                pass
            assert batch.progress.completed == 3
            await dispatcher.complete(jobs(1, client="ci")[0])
            await trio.sleep(2)  # the audit is written by the sync
            rows = dispatcher.store.records.query("SELECT work, count(*) FROM audit GROUP BY work")
            attempts = dispatcher.store.records.query(
                "SELECT work, count(*) FROM audit_attempt GROUP BY work"
            )
            got = report(dispatcher.store.records.query, since=0, by="work", ceiling_usd=1.0)
            own = report(
                dispatcher.store.records.query, since=0, by="work", ceiling_usd=1.0, client="ci"
            )
    assert sorted(map(tuple, rows)) == [("batch", 3), ("interactive", 1)]
    assert sorted(map(tuple, attempts)) == [("batch", 3), ("interactive", 1)]
    for r in (got, own):
        assert {(g.key, g.jobs, g.answered) for g in r.groups} == {
            ("batch", 3, 3),
            ("interactive", 1, 1),
        }


async def test_a_full_batch_waits_for_a_slot_and_a_fault_ends_only_its_job(autojump_clock):
    """Concurrency 1, three jobs of a second each: they run one after another (the batch waits
    for a slot, it does not spin — on the virtual clock a spin would never let time pass); a
    job whose serve raises something other than JobFailed ends with its error, the others are
    answered."""
    from lanes._core.batch.library import LibraryBatch
    from lanes._core.engine.backlog import Backlog

    started: list[float] = []

    async def serve(job: lanes.Job) -> lanes.Reply:
        started.append(trio.current_time())
        await trio.sleep(1)
        if "item 1" in str(job.messages):
            raise ValueError("a bug of ours")
        return lanes.Reply(body={"choices": []}, lane="l", provider="p", model="m", route="local")

    backlog = Backlog(0.2)
    batch = LibraryBatch(
        jobs(3), serve, window_s=600, headroom=0.2, concurrency=1, interactive_waiting=lambda: 0,
        backlog=backlog,
    )  # fmt: skip
    async with trio.open_nursery() as nursery:
        nursery.start_soon(batch.run)
        await trio.sleep(0.5)
        assert backlog.items == 3  # none ended yet: all three left
        results = [r async for r in batch.results()]
    assert backlog.items == 0
    assert started == [0.0, 1.0, 2.0]
    by_index = {r.index: r for r in results}
    assert by_index[0].reply is not None and by_index[2].reply is not None
    assert isinstance(by_index[1].error, lanes.JobFailed) and "ValueError" in str(by_index[1].error)
    assert (batch.progress.completed, batch.progress.failed, batch.progress.running) == (2, 1, 0)


async def test_interactive_jobs_spare_the_quotas_a_batch_still_needs(env, autojump_clock):
    """Lanes a (rpd 100) then b (rpd 10), the headroom 0.2: after 8 requests on b, a batch may use
    no more of b's day, while b still has 2 for interactive work. An interactive job goes to a
    while no batch has items left, to b (the share kept for it) while one has, and to a again
    once b's day is used up; a batch item is never sent to b."""
    async with (
        open_fake("a", models=("free-model",)) as a,
        open_fake("b", models=("free-model",)) as b,
    ):
        cfg = config(
            free_lane("a", a.base_url, free_tier={"kind": "rate_limited", "rpd": 100}),
            free_lane("b", b.base_url, free_tier={"kind": "rate_limited", "rpd": 10}),
        )
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:

            async def lane() -> str:
                return (await dispatcher.complete(jobs(1, model="free-model")[0])).lane

            for job in jobs(8, model="b/free-model"):
                assert (await dispatcher.complete(job)).lane == "b"
            assert await lane() == "a"  # no batch: config order
            dispatcher.work_left.left("test", 5)
            lanes_served = [await lane() for _ in range(3)]
            assert lanes_served == ["b", "b", "a"]  # b's two kept for interactive work, then a
            dispatcher.work_left.left("test", 0)
            assert await lane() == "a"
            async with dispatcher.submit_batch(jobs(3, model="free-model"), window="1h") as batch:
                pass
            assert batch.progress.completed == 3 and dispatcher.work_left.items == 0
    assert len(b.requests()) == 10 and len(a.requests()) == 1 + 1 + 1 + 3


async def test_a_minute_kept_off_goes_after_a_day_kept_off(env, autojump_clock):
    """Beside a batch, of two free candidates held from batch items, the one whose day is used
    to the headroom (kept off till midnight) serves an interactive job before the one whose
    minute is (kept off for seconds); a candidate with room for the batch comes last."""
    async with (
        open_fake("a", models=("free-model",)) as a,
        open_fake("m", models=("free-model",)) as m,
        open_fake("d", models=("free-model",)) as d,
    ):
        cfg = config(
            free_lane("a", a.base_url),
            free_lane("m", m.base_url, free_tier={"kind": "rate_limited", "rpm": 5}),
            free_lane("d", d.base_url, free_tier={"kind": "rate_limited", "rpd": 5}),
        )
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:

            async def lane() -> str:
                return (await dispatcher.complete(jobs(1, model="free-model")[0])).lane

            await trio.sleep(60 - trio.current_time() % 60 + 1)  # a minute's start (UTC epoch)
            for name in ("m", "d"):  # 4 of 5: a batch keeps off (kept(5, 0.2) = 1)
                for job in jobs(4, model=f"{name}/free-model"):
                    await dispatcher.complete(job)
            dispatcher.work_left.left("test", 1)
            assert await lane() == "d"
            assert await lane() == "m"
            assert await lane() == "a"


async def test_beside_a_batch_the_quota_nearest_used_up_serves_first(env, autojump_clock):
    """Lanes a (rpd 100: 80 for batch items) then b (rpd 50: 40): beside a batch an interactive
    job goes to b, whose day a batch would use up first; without one, or with `[batch] spare`
    off, to a (config order)."""
    async with (
        open_fake("a", models=("free-model",)) as a,
        open_fake("b", models=("free-model",)) as b,
    ):
        cfg = config(
            free_lane("a", a.base_url, free_tier={"kind": "rate_limited", "rpd": 100}),
            free_lane("b", b.base_url, free_tier={"kind": "rate_limited", "rpd": 50}),
        )
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:

            async def lane() -> str:
                return (await dispatcher.complete(jobs(1, model="free-model")[0])).lane

            assert await lane() == "a"
            dispatcher.work_left.left("test", 1)
            assert [await lane() for _ in range(2)] == ["b", "b"]
        kept = attrs.evolve(cfg, batch=attrs.evolve(cfg.batch, spare=False))
        async with lanes.open_dispatcher(kept, env=env) as dispatcher:  # [batch] spare = false
            dispatcher.work_left.left("test", 1)
            assert (await dispatcher.complete(jobs(1, model="free-model")[0])).lane == "a"


def capped(n: int) -> list[lanes.Job]:
    """Jobs whose output cap makes a paid worst case of cents, not dollars."""
    return jobs(n, params={"max_tokens": 50})


async def test_a_budget_pays_only_what_free_capacity_can_not_serve_in_the_window(
    env, autojump_clock
):
    """The free model answers 429 until after the 10-minute window; consent is `allow`. With a
    budget, the jobs are served paid, one at a time, and what was spent (the ledger's cost of
    each reply) stays within it; without one, nothing is paid and every job expires. A budget
    pays nothing while free capacity comes back within the window."""
    async with (
        open_fake("free", models=("free-model",)) as free,
        open_fake("paid", models=("paid-model",)) as paid,
    ):
        free.script("free-model", rate_limited(retry_after=60), answer(), answer())
        cfg = config(free_lane("free", free.base_url), paid_lane("paid", paid.base_url))
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
            async with dispatcher.submit_batch(capped(2), window=600, max_paid_usd=1.0) as waits:
                pass
            assert waits.progress.completed == 2 and paid.requests() == []
            assert waits.progress.paid_usd == 0.0
            free.script("free-model", *[rate_limited(retry_after=7200)] * 20)
            async with dispatcher.submit_batch(capped(2), window=600) as unpaid:
                pass
            assert paid.requests() == [] and unpaid.progress.failed == 2
            async with dispatcher.submit_batch(capped(3), window=600, max_paid_usd=0.01) as batch:
                results = [r async for r in batch.results()]
    assert [r.reply is not None and r.reply.route == "paid_fallback" for r in results] == [True] * 3
    spent = sum(r.reply.cost_usd for r in results if r.reply is not None)
    assert len(paid.requests()) == 3 and 0 < spent <= 0.01
    assert batch.progress.paid_usd == pytest.approx(spent)


async def test_a_budget_too_small_or_consent_not_allow_pays_nothing(env, autojump_clock):
    """A budget below one request's worst case pays nothing (the jobs expire); with consent
    `ask`, a budget pays nothing either — work that can wait asks no approval; a budget that is
    not a number of dollars from 0 to 1000 is refused."""
    for policy, budget in (({"free_tier_fallback": "allow"}, 1e-7),
                           ({"free_tier_fallback": "ask"}, 0.01)):  # fmt: skip
        async with (
            open_fake("free", models=("free-model",)) as free,
            open_fake("paid", models=("paid-model",)) as paid,
        ):
            free.script("free-model", *[rate_limited(retry_after=7200)] * 20)
            cfg = config(
                free_lane("free", free.base_url),
                paid_lane("paid", paid.base_url),
                policy={**ENGINE_POLICY, **policy},
            )
            async with (
                lanes.open_dispatcher(cfg, env=env) as dispatcher,
                dispatcher.submit_batch(capped(2), window=600, max_paid_usd=budget) as batch,
            ):
                results = [r async for r in batch.results()]
        assert paid.requests() == [], policy
        assert all(isinstance(r.error, lanes.BatchExpired) for r in results), policy
        assert batch.progress.paid_usd == 0.0
    for bad in (-1.0, float("nan"), 1001.0):
        with pytest.raises(ValueError, match="max_paid_usd"):
            async with (
                lanes.open_dispatcher(cfg, env=env) as dispatcher,
                dispatcher.submit_batch(capped(1), max_paid_usd=bad),
            ):
                pass

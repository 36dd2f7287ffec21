"""One knock per closed door per host: the probe lease in the SQLite state file, shared by every
process that opens it (the sidecar, its workers, the jobs that import the dispatcher), and the
backoffs and kill switches one process writes, seen by the others before their next attempt."""

from __future__ import annotations

import signal
import time

import pytest
import trio

import lanes
from helpers import ENGINE_POLICY, config, free_lane, paid_lane, sqlite_store
from lanes._core.freetier.backoff import Backoff
from lanes._core.state.store import SQLiteStore
from lanes.harness.processes import open_job_processes
from lanes.testing import answer, hang, open_fake, rate_limited, status

MESSAGES = [{"role": "user", "content": "hi"}]
NOW = 1_800_000_000.0


def closed(until: float) -> Backoff:
    return Backoff(until=until, step=1, reason="rate_limited", source="retry-after")


def leases(store: SQLiteStore) -> list[tuple[object, ...]]:
    return store.records.query("SELECT scope, token FROM probe_lease")


def test_one_process_probes_and_its_release_carries_the_backoff(tmp_path):
    """Two processes on one file: one takes the lease, the other is refused; the release writes the
    backoff first, so the other then sees the door closed — and may probe once it reopens."""
    a, b = SQLiteStore(str(tmp_path / "state.db")), SQLiteStore(str(tmp_path / "state.db"))
    assert a.probe_lease("free/m", 5.0, NOW) is True
    assert b.probe_lease("free/m", 5.0, NOW) is False
    a.probe_done("free/m", ok=False, backoff=closed(NOW + 20))
    seen = b.probe_lease("free/m", 5.0, NOW + 1)
    assert isinstance(seen, Backoff) and seen.until == NOW + 20
    assert leases(b) == []
    assert b.probe_lease("free/m", 5.0, NOW + 21) is True  # the door reopened: b knocks, once
    assert a.probe_lease("free/m", 5.0, NOW + 21) is False


def test_an_expired_lease_is_taken_over_and_its_old_holder_can_not_release_the_new_one(tmp_path):
    """A lease lapses at its expiry; the process whose lease lapsed then releases only its own
    token, never the lease another process took since."""
    path = str(tmp_path / "state.db")
    a, b, c = SQLiteStore(path), SQLiteStore(path), SQLiteStore(path)
    assert a.probe_lease("free/m", 5.0, NOW) is True
    assert b.probe_lease("free/m", 5.0, NOW + 4.9) is False
    assert b.probe_lease("free/m", 5.0, NOW + 5.1) is True  # a's lapsed
    a.probe_done("free/m", ok=True)  # late: a's token is not b's
    assert c.probe_lease("free/m", 5.0, NOW + 6) is False
    b.probe_done("free/m", ok=True)
    assert c.probe_lease("free/m", 5.0, NOW + 6) is True


def test_a_process_takes_over_its_own_lease(tmp_path):
    """A process never waits on a lease it holds itself (its release lost to a busy file)."""
    a = SQLiteStore(str(tmp_path / "state.db"))
    assert a.probe_lease("free/m", 5.0, NOW) is True
    assert a.probe_lease("free/m", 5.0, NOW + 1) is True
    assert len(leases(a)) == 1


def test_peek_says_what_other_processes_wrote_and_nothing_else(tmp_path):
    """A backoff or a kill switch written by another process is in the next peek; a peek with
    nothing new is None; in memory there is no one else."""
    a, b = SQLiteStore(str(tmp_path / "state.db")), SQLiteStore(str(tmp_path / "state.db"))
    b.peek(NOW)  # the first look reads whatever is there
    assert b.peek(NOW) is None
    a.put_backoffs({"free/m": closed(NOW + 30)}, NOW)
    news = b.peek(NOW)
    assert news is not None and [s for s, _ in news.backoffs] == ["free/m"]
    assert news.switches == set()
    assert b.peek(NOW) is None
    a.put_switch("paid", True, NOW)
    news = b.peek(NOW)
    assert news is not None and news.switches == {"paid"}
    assert SQLiteStore(":memory:").peek(NOW) is None


async def test_a_switch_and_a_backoff_from_another_process_hold_from_the_next_job(
    tmp_path, env, autojump_clock
):
    """Another process (here: another connection to the file) switches the lane off, then on and
    writes a backoff: this dispatcher's very next job obeys each — no request sent, and no sync
    ran in between."""
    async with open_fake("paid", models=("paid-model",)) as paid:
        cfg = config(paid_lane("paid", paid.base_url), state=str(tmp_path / "state.db"))
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
            other = SQLiteStore(str(tmp_path / "state.db"))
            now = dispatcher.now_wall()
            other.put_switch("paid", True, now)
            with pytest.raises(lanes.JobFailed) as switched:
                await dispatcher.complete(lanes.Job(messages=MESSAGES, deadline_s=5))
            other.put_switch("paid", False, now)
            other.put_backoffs({"paid/paid-model": closed(now + 30)}, now)
            with pytest.raises(lanes.JobFailed) as backed_off:
                await dispatcher.complete(lanes.Job(messages=MESSAGES, deadline_s=5))
            elapsed = dispatcher.now_wall() - now
            other.close()
    assert "lane switched off" in str(switched.value)
    assert "backoff (rate_limited" in str(backed_off.value)
    assert elapsed < 0.5  # the half-second sync did not run in between
    assert paid.requests() == []


@pytest.mark.free_lane
async def test_a_job_waits_for_another_process_probe_and_takes_its_answer(
    tmp_path, env, autojump_clock
):
    """While another process holds the lease of a cold model, this process sends nothing: its job
    waits, and when the other's probe answers 429 the backoff it wrote ends the wait."""
    async with open_fake("free", models=("free-model",)) as free:
        cfg = config(
            free_lane("free", free.base_url, first_token_s=5.0),
            state=str(tmp_path / "state.db"),
            policy={"free_tier_fallback": "off"},
        )
        other = SQLiteStore(str(tmp_path / "state.db"))
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
            scope = dispatcher.manager.scope("free", "free-model")
            assert other.probe_lease(scope, 30.0, dispatcher.now_wall()) is True
            failed: list[lanes.JobFailed] = []

            async def job() -> None:
                try:
                    await dispatcher.complete(lanes.Job(messages=MESSAGES, deadline_s=8))
                except lanes.JobFailed as exc:
                    failed.append(exc)

            async with trio.open_nursery() as nursery:
                for _ in range(5):
                    nursery.start_soon(job)
                await trio.sleep(1.0)
                other.probe_done(scope, ok=False, backoff=closed(dispatcher.now_wall() + 60))
            waited = trio.current_time()
        other.close()
    assert free.requests() == []
    assert len(failed) == 5 and all(f.code == "free_tier_exhausted" for f in failed)
    assert waited < 1.0 + 0.5  # woken by the answer, not by first_token_s


@pytest.mark.free_lane
@pytest.mark.parametrize(
    "how", ["429", "503", "deadline", "client gone", "stream broken off", "unencodable"]
)
async def test_the_lease_is_handed_back_on_every_way_out(tmp_path, env, autojump_clock, how):
    """Whatever ends the probe — a 429, a fault, our deadline, a caller that went away, a stream
    left early, a request that can not be encoded — the lease row is gone afterwards (with the
    backoff written, for the 429)."""
    behaviour = {"429": rate_limited(retry_after=30), "503": status(503)}.get(how, hang())
    if how == "stream broken off":
        behaviour = answer(chunk_delay_s=0.1)
    async with open_fake("free", models=("free-model",)) as free:
        free.script("free-model", behaviour)
        cfg = config(
            free_lane("free", free.base_url),
            state=str(tmp_path / "state.db"),
            policy={**ENGINE_POLICY, "transient_retries": 0},
        )
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
            store = sqlite_store(dispatcher)
            params = {"bad": float("nan")} if how == "unencodable" else {}
            job = lanes.Job(messages=MESSAGES, deadline_s=2, params=params)
            during: list[tuple[object, ...]] = []
            with trio.move_on_after(1.0 if how == "client gone" else 10.0):
                try:
                    if how == "stream broken off":
                        async with dispatcher.open_stream(job) as stream:
                            async for _ in stream:
                                during = leases(store)
                                break
                    else:
                        await dispatcher.complete(job)
                except lanes.JobFailed:
                    pass
            after = leases(store)
            backoffs = store.records.query("SELECT scope FROM backoff WHERE until > ?", (0,))
    if how == "stream broken off":
        assert during == []  # handed back at its first chunk: the model serves (the others go)
    assert after == []
    assert (backoffs != []) == (how == "429")
    assert len(free.requests()) == (0 if how == "unencodable" else 1)


@pytest.mark.slow
@pytest.mark.free_lane
async def test_three_job_processes_on_one_file_knock_once_per_window(tmp_path):
    """Three processes that import the dispatcher, one SQLite state file, 30 jobs each at once
    against a provider answering 429 + Retry-After: 2 — twice, a window apart: one upstream
    request per window."""
    async with open_fake("free", models=("free-model",)) as free:
        free.script("free-model", rate_limited(retry_after=2))
        cfg = {
            "state": str(tmp_path / "state.db"),
            "policy": {"free_tier_fallback": "off", "max_wait_s": 0},  # no job waits it out
            "lanes": [free_lane("free", free.base_url)],
        }
        async with open_job_processes(
            cfg, tmp_path / "jobs", count=3, jobs=30, rounds=2, env={"FREE_API_KEY": "k"}
        ) as herd:
            herd.start(1)
            first = await herd.outcomes(1)
            await trio.sleep(2 * 1.1 + 0.2)  # the window, its jitter, and a margin
            herd.start(2)
            second = await herd.outcomes(2)
    times = sorted(r.at for r in free.requests())
    assert len(times) >= 2  # a knock in each round
    assert all(b - a >= 2.0 for a, b in zip(times, times[1:], strict=False)), times  # one a window
    for outcomes in (*first, *second):
        assert sum(outcomes.values()) == 30 and "ok" not in outcomes


@pytest.mark.slow
@pytest.mark.free_lane
async def test_a_lease_holder_killed_mid_probe_is_released_by_its_expiry(tmp_path, env):
    """A job process SIGKILLed while its probe hangs leaves its lease behind: refused to everyone
    until the lease expires, then the next process probes."""
    async with open_fake("free", models=("free-model",)) as free:
        free.script("free-model", hang())
        lane = free_lane("free", free.base_url, attempt_timeout_s=2.0, first_token_s=2.0)
        cfg = {"state": str(tmp_path / "state.db"), "lanes": [lane]}
        async with open_job_processes(
            cfg, tmp_path / "jobs", count=1, jobs=1, env={"FREE_API_KEY": "k"}
        ) as herd:
            herd.start(1)
            with trio.fail_after(20):
                while not free.requests():  # noqa: ASYNC110 - the fake logs, no event
                    await trio.sleep(0.01)
            herd.processes[0].send_signal(signal.SIGKILL)
            await herd.processes[0].wait()
        store = SQLiteStore(str(tmp_path / "state.db"))
        [(scope, until)] = store.records.query("SELECT scope, until FROM probe_lease")
        assert until <= time.time() + 3.0  # the lane's timeouts + 1 s
        assert store.probe_lease(scope, 3.0, until - 0.5) is False
        store.close()
        free.script("free-model", answer())
        async with lanes.open_dispatcher(
            config(lane, state=str(tmp_path / "state.db")), env=env, epoch_now=until + 0.01
        ) as dispatcher:
            reply = await dispatcher.complete(lanes.Job(messages=MESSAGES, deadline_s=5))
    assert reply.lane == "free" and len(free.requests()) == 2

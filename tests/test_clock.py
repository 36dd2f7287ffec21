"""Time a process can trust (issue 28, Build 3): the wall is read at every decision, through one
injectable source; a process whose wall disagrees with the state store's clock closes paid and
says why; the ledger's day is the store's (the host's clock for SQLite, `TIME` for Redis).
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from trio.testing import MockClock

import lanes
from helpers import config, examples, local_lane, paid_lane, sqlite_store
from lanes._core.freetier.manager import FreeTierManager
from lanes._core.freetier.windows import window_id
from lanes._core.model.candidates import Candidate
from lanes._core.model.clocks import EpochTime, disagreement
from lanes._core.model.errors import ConfigError
from lanes._core.model.job import Job
from lanes._core.money.ledger import Ledger
from lanes._core.money.quote import quote
from lanes._core.policy.policy import PolicyConfig
from lanes._core.runtime.wall import OFFSET_ENV, Wall, drill_offset
from lanes._core.state.clock import StoreClock
from lanes._core.state.paid import PaidAsk
from lanes._core.state.redis_store import RedisStore
from lanes._core.state.store import ClockRefused, SQLiteStore
from lanes.testing import open_fake, status

MESSAGES = [{"role": "user", "content": "What day is it?"}]
DAY_S = 86400.0
CLOCK_LINE = "clock: this process's wall clock is"


def clock_lines(caplog: pytest.LogCaptureFixture, text: str = CLOCK_LINE) -> int:
    return sum(text in r.getMessage() for r in caplog.records)


# -- the rule (pure) ---------------------------------------------------------------------------


@given(st.floats(-1e7, 1e7, allow_nan=False), st.floats(0, 1e6, allow_nan=False))
def test_a_wall_disagrees_exactly_beyond_the_tolerance(skew, tolerance):
    """A wall disagrees with the store's clock exactly when they are further apart than the
    tolerance, and the reason says which side it is on."""
    said = disagreement(skew, tolerance, "the host's clock")
    assert bool(said) == (abs(skew) > tolerance)
    if said:
        assert ("ahead of" in said) == (skew < 0)


@pytest.mark.parametrize("raw", ["x", "nan", "inf", "-1e9", "604801"])
def test_the_drill_offset_is_a_bounded_number_of_seconds(raw):
    """LANES_DRILL_WALL_OFFSET_S must be a finite number of seconds within a week; an error
    names the variable."""
    with pytest.raises(ConfigError) as refused:
        drill_offset({OFFSET_ENV: raw})
    assert refused.value.key == OFFSET_ENV and OFFSET_ENV in str(refused.value)
    assert drill_offset({OFFSET_ENV: " -86400 "}) == -DAY_S and drill_offset({}) == 0.0


# -- the wall is read at every decision ----------------------------------------------------------


async def test_the_wall_follows_the_system_clock_at_every_read(tmp_path, env, monkeypatch):
    """In a real run the wall and the ledger's day follow the system clock when it steps (an NTP
    step, a resume from suspend), instead of a time read once at start-up and extrapolated."""
    async with (
        open_fake("paid", models=("paid-model",)) as paid,
        lanes.open_dispatcher(
            config(paid_lane("paid", paid.base_url), state=str(tmp_path / "s.db")), env=env
        ) as dispatcher,
    ):
        before = dispatcher.now_wall()
        stepped = time.time() + DAY_S
        monkeypatch.setattr(time, "time", lambda: stepped)
        assert dispatcher.now_wall() == pytest.approx(stepped)
        await dispatcher.complete(lanes.Job(messages=MESSAGES, model="paid/paid-model"))
        [(day,)] = sqlite_store(dispatcher).records.query("SELECT day FROM paid_ledger")
    assert day == window_id("day", stepped) == window_id("day", before) + 1


async def test_under_a_mock_clock_the_wall_is_simulated(autojump_clock, tmp_path, env):
    """Under trio's MockClock the wall (and the host's clock it is checked against) advance with
    virtual time: an hour's sleep is an hour of wall time, and the two still agree."""
    async with lanes.open_dispatcher(
        config(local_lane("local", "http://127.0.0.1:9"), state=str(tmp_path / "s.db")), env=env
    ) as dispatcher:
        before = dispatcher.now_wall()
        await trio.sleep(3600)
        assert dispatcher.now_wall() - before == pytest.approx(3600, abs=0.01)
        assert dispatcher.clock.refusal() == ""


async def test_a_process_whose_wall_steps_a_day_closes_paid_and_says_why_once(
    autojump_clock, tmp_path, env, caplog_lanes
):
    """A wall stepped a day ahead of the host's clock: paid is refused (429, the reason in the
    job's story), free capacity carries on, one log line says why, the audit keeps the host's
    day; stepped back, paid reopens with one more line."""
    async with (
        open_fake("local", models=("local-model",)) as local,
        open_fake("paid", models=("paid-model",)) as paid,
    ):
        cfg = config(
            local_lane("local", local.base_url),
            paid_lane("paid", paid.base_url),
            state=str(tmp_path / "s.db"),
        )
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
            dispatcher.clock.wall.step(DAY_S)
            served = await dispatcher.complete(lanes.Job(messages=MESSAGES))
            local.script("local-model", status(503))
            refused = []
            for _ in range(3):
                with pytest.raises(lanes.PaidBudgetExhausted) as exc:
                    await dispatcher.complete(lanes.Job(messages=MESSAGES))
                refused.append(exc.value)
            shown = dispatcher.statistics().clock
            await trio.sleep(1)  # a sync: the audit rows reach the file
            [(stamped,)] = sqlite_store(dispatcher).records.query("SELECT MAX(at) FROM audit")
            assert abs(stamped - dispatcher.clock.trusted()) < 5  # on the host's day, not ahead
            dispatcher.clock.wall.step(-DAY_S)
            reopened = await dispatcher.complete(lanes.Job(messages=MESSAGES))
    assert served.lane == "local" and reopened.lane == "paid" and len(paid.log) == 1
    assert all("ahead of the host's clock" in str(e) for e in refused)
    assert all(
        any("ahead of the host's clock" in s.reason for s in e.skips if s.lane == "paid")
        for e in refused
    )
    assert shown is not None and shown.refusal and shown.offset_s == DAY_S
    assert clock_lines(caplog_lanes) == 1
    assert clock_lines(caplog_lanes, "agrees with the host's clock again") == 1


# -- the ledger's day and the ceiling, whatever the processes' walls say (SQLite) -----------------


class SteppedWall(Wall):
    """A wall `offset_s` from a host clock the test moves (`host[0]`)."""

    def __init__(self, host: list[float], offset_s: float) -> None:
        super().__init__()
        self._host = host
        self.offset_s = offset_s

    def __call__(self) -> EpochTime:
        return EpochTime(self._host[0] + self.offset_s)

    def reference(self) -> EpochTime:
        return EpochTime(self._host[0])


CANDIDATE = Candidate(
    lane="paid", model="m", tier="paid", input_usd_per_mtok=1.0, output_usd_per_mtok=2.0
)
TOLERANCE_S = 120.0
offsets = st.sampled_from([0.0, 30.0, -90.0, 119.0, 121.0, -3600.0, DAY_S, -DAY_S])


@settings(max_examples=examples(60))
@given(
    walls=st.lists(offsets, min_size=2, max_size=3),
    steps=st.lists(
        st.tuples(st.integers(0, 2), st.floats(0, 30_000), st.integers(1, 400)), max_size=40
    ),
)
def test_processes_on_one_file_never_bill_past_one_ceiling_a_day(walls, steps):
    """Processes on one state file, each with its wall off by its own offset, reserve at random
    moments: what is granted per UTC day of the host's clock never crosses the ceiling, every
    reservation is on that day, and a process further off than the tolerance is granted
    nothing."""
    ceiling = 0.004
    host = [1_800_000_000.0 - 1_000.0]  # a little before a UTC midnight
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "s.db")
        stores = [SQLiteStore(path) for _ in walls]
        policy = PolicyConfig(paid_ceiling_usd_per_day=ceiling, clock_tolerance_s=TOLERANCE_S)
        ledgers = []
        for store, offset in zip(stores, walls, strict=True):
            clock = StoreClock(
                SteppedWall(host, offset), tolerance_s=TOLERANCE_S, kind="sqlite", where=path
            )
            ledgers.append(Ledger(lambda: policy, FreeTierManager(), store, clock.wall, clock))
        granted: dict[int, float] = {}

        async def run() -> None:
            for which, advance, tokens in steps:
                host[0] += advance
                which %= len(ledgers)
                job = Job(messages=MESSAGES, params={"max_tokens": tokens})
                ledger = ledgers[which]
                try:
                    reservation = await ledger.reserve(quote(CANDIDATE, job, policy))
                except lanes.PaidBudgetExhausted:
                    continue
                assert abs(walls[which]) <= TOLERANCE_S
                day = window_id("day", host[0])
                granted[day] = granted.get(day, 0.0) + reservation.amount_usd

        try:
            trio.run(run, clock=MockClock())
            rows = stores[0].records.query(
                "SELECT day, SUM(reserved) FROM paid_ledger GROUP BY day"
            )
        finally:
            for store in stores:
                store.close()
    assert {day: pytest.approx(usd) for day, usd in rows} == granted
    assert all(usd <= ceiling + 1e-12 for usd in granted.values())


# -- Redis: the server's TIME decides the day, and refuses a wall off by more than the tolerance -


def redis_host(url: str) -> RedisStore:
    store = RedisStore(url, local=SQLiteStore(":memory:"))
    store.begin_sync(time.time())
    store.flush()
    return store


def test_redis_refuses_a_wall_a_day_off_and_corrects_a_wrong_day(redis_server):
    """The reservation script reads the server's TIME: a wall a day ahead is refused (with the
    skew); a wall within the tolerance that guessed the wrong day reserves on the server's."""
    store = redis_host(redis_server.url)
    today = window_id("day", time.time())

    def reserve(wall: float) -> str | None:
        return store.reserve(
            PaidAsk(
                day=today + 1,
                amount=0.01,
                ceiling=1.0,
                lane="p",
                model="m",
                job="j",
                cohort=None,
                wall=wall,
                tolerance_s=120.0,
            )
        )

    with pytest.raises(ClockRefused) as refused:
        reserve(time.time() + DAY_S)
    assert refused.value.skew_s == pytest.approx(-DAY_S, abs=5)
    reservation = reserve(time.time())
    assert reservation is not None and reservation.startswith(f"{today}:")
    assert store.paid_spent(today) == pytest.approx(0.01) and store.paid_spent(today + 1) == 0.0
    store.close()


async def test_a_host_off_by_a_day_on_redis_closes_paid_and_says_why(
    redis_server, env, caplog_lanes
):
    """A host whose wall is a day ahead of the Redis server: its beat measures the skew, paid is
    refused before any request, /v1/lanes-level statistics say why; a host on time pays."""
    async with open_fake("paid", models=("paid-model",)) as paid:
        cfg = config(paid_lane("paid", paid.base_url), state=redis_server.url)
        async with (
            lanes.open_dispatcher(cfg, env=env, epoch_now=time.time() + DAY_S) as ahead,
            lanes.open_dispatcher(cfg, env=env) as right,
        ):
            with pytest.raises(lanes.PaidBudgetExhausted) as refused:
                await ahead.complete(lanes.Job(messages=MESSAGES, model="paid/paid-model"))
            await right.complete(lanes.Job(messages=MESSAGES, model="paid/paid-model"))
            shown = ahead.statistics().clock
    assert "ahead of the Redis server's clock (TIME)" in str(refused.value)
    assert shown is not None and shown.skew_s == pytest.approx(-DAY_S, abs=5)
    assert len(paid.log) == 1 and clock_lines(caplog_lanes) == 1


def test_the_clock_line_names_its_logger(caplog):
    """The disagreement is said on the `lanes` logger at WARNING (where operators look)."""
    caplog.set_level(logging.WARNING, logger="lanes")
    clock = StoreClock(SteppedWall([0.0], DAY_S), tolerance_s=1.0, kind="sqlite", where="f.db")
    assert clock.refusal() and clock.refusal()
    assert [r.levelno for r in caplog.records if CLOCK_LINE in r.getMessage()] == [logging.WARNING]


async def test_a_process_whose_whole_clock_is_ahead_can_not_spend_the_day_again(
    env, tmp_path, autojump_clock, caplog_lanes
):
    """Two processes on one state file. A spends the day's ceiling and is refused; B starts with
    its whole clock 35,818 s ahead — its wall and the host clock it reads (libfaketime's shape,
    which no offset check sees) — just past UTC midnight, on a ledger day of its own. The beats
    tell them apart: B gets no paid request out (before, it billed the ceiling a second time),
    both say why in one line each, and once B is gone A's paid reopens."""
    night = window_id("day", time.time()) * DAY_S + 72_000.0  # 20:00 UTC
    async with open_fake("paid", models=("paid-model",)) as paid:
        cfg = config(
            paid_lane("paid", paid.base_url),
            state=str(tmp_path / "shared.db"),
            policy={"free_tier_fallback": "allow", "paid_ceiling_usd_per_day": 0.0002},
        )
        job = lanes.Job(messages=MESSAGES, model="paid/paid-model", params={"max_tokens": 50})
        async with lanes.open_dispatcher(cfg, env=env, epoch_now=night) as a:
            served_a = 0
            with pytest.raises(lanes.PaidBudgetExhausted):
                for _ in range(100):
                    await a.complete(job)
                    served_a += 1
            sent_by_a = len(paid.log)
            async with lanes.open_dispatcher(cfg, env=env, epoch_now=night + 35_818) as b:
                assert window_id("day", b.now_wall()) == window_id("day", a.now_wall()) + 1
                refused = []
                for _ in range(10):
                    with pytest.raises(lanes.PaidBudgetExhausted) as caught:
                        await b.complete(job)
                    refused.append(str(caught.value))
                    await trio.sleep(0.3)
                seen_by_a = a.statistics().clock
            await trio.sleep(35)  # B withdrew its beat at exit: A's view agrees with every peer
            after = a.statistics().clock
            assert after is not None and after.refusal == ""
    assert served_a >= 1 and len(paid.log) == sent_by_a  # nothing sent for B
    assert all("sharing the state store" in r for r in refused), refused
    assert seen_by_a is not None and "live process" in seen_by_a.refusal
    said = [r.getMessage() for r in caplog_lanes.records if "clock: " in r.getMessage()]
    closed = [line for line in said if "paid stays closed" in line]
    assert 2 <= len(closed) <= 4, said  # each process: "not yet seen moving", then "live", once
    assert said[-1].endswith("agree on the clock again"), said  # A, once B was gone

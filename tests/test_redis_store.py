"""The Redis store against a real redis-server: the same contract as SQLite, shared between hosts.

Two `RedisStore` objects on one server stand for two hosts. Nothing here sleeps for timing: expiry
is checked through Redis' own TTLs, concurrency with real threads racing on real sockets.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis

from lanes._core.state.redis_store import RedisStore, redacted
from lanes._core.state.store import LocalView, SQLiteStore, StoreUnavailable
from lanes.freetier.backoff import Backoff, Reason
from lanes.freetier.headers import RateLimitSnapshot, Window
from lanes.freetier.windows import end_of, window_id


def host(url: str) -> RedisStore:
    store = RedisStore(url, local=SQLiteStore(":memory:"))
    store.begin_sync(time.time())
    store.flush()  # a first full sync: the store is up
    return store


def is_up(store: RedisStore) -> bool:
    """Read `store.up` afresh: a bare `assert not store.up` would leave mypy sure it stays False
    across the calls that bring the store back up."""
    return store.up


def backoff(until: float, reason: Reason = "rate_limited") -> Backoff:
    return Backoff(until=until, step=1, reason=reason, source="retry-after")


def test_backoff_race_keeps_the_later_deadline_and_expires_on_its_own(redis_server):
    """Two hosts racing on one scope: the later deadline wins, and the key expires at it."""
    a, b = host(redis_server.url), host(redis_server.url)
    now = time.time()
    a.put_backoffs({"groq/*": backoff(now + 30)})
    b.put_backoffs({"groq/*": backoff(now + 10)})  # the earlier one loses, whoever writes last
    b.put_backoffs({"groq/m": backoff(now + 5)})
    a.put_backoffs({"groq/m": backoff(now + 8)})
    seen = dict(b.backoffs(now))
    assert seen["groq/*"].until == pytest.approx(now + 30)
    assert seen["groq/m"].until == pytest.approx(now + 8)
    ttl_ms = redis.Redis.from_url(redis_server.url).pttl("lanes:backoff:groq/*")
    assert 29_000 < ttl_ms <= 30_001  # the key expires by itself at the deadline
    assert dict(a.backoffs(now + 9)).keys() == {"groq/*"}  # past deadlines are not reported


def test_usage_counters_add_up_across_hosts_and_expire_at_the_window_end(redis_server):
    """Counts from two hosts add up; each window's hash expires at its UTC end."""
    a, b = host(redis_server.url), host(redis_server.url)
    now = time.time()
    day, minute = window_id("day", now), window_id("minute", now)
    a.add_usage(
        [(("groq/*", "requests", "day", day), 3), (("groq/*", "requests", "minute", minute), 3)],
        {("openrouter", day): 0.5},
    )
    b.add_usage([(("groq/*", "requests", "day", day), 4)], {("openrouter", day): 0.25})
    totals = dict(a.usage_totals(now))
    assert totals[("groq/*", "requests", "day", day)] == 7
    assert totals[("groq/*", "requests", "minute", minute)] == 3
    assert b.spend_totals() == {("openrouter", day): 0.75}
    ttl = redis.Redis.from_url(redis_server.url).ttl(f"lanes:usage:day:{day}")
    assert abs(ttl - (end_of("day", day) + 60 - now)) <= 2  # UTC midnight (plus a minute's grace)
    assert a.usage_totals(end_of("day", day) + 1) == []  # the next day starts from zero


def test_a_host_that_never_called_a_provider_knows_its_last_headers(redis_server):
    """A header snapshot written by one host is read by another."""
    a, b = host(redis_server.url), host(redis_server.url)
    window = Window(dimension="requests", window_s=60.0, limit=30, remaining=2, reset_s=12.0)
    snapshot = RateLimitSnapshot(
        requests_remaining=2,
        requests_limit=30,
        tokens_remaining=None,
        tokens_limit=None,
        reset_requests_s=12.0,
        reset_tokens_s=None,
        retry_after_s=None,
        windows=(window,),
    )
    a.put_snapshots({"groq/*": (123.0, snapshot)})
    at, seen = b.snapshots()["groq/*"]
    assert (at, seen.requests_remaining, seen.windows) == (123.0, 2, (window,))


def test_paid_reservations_from_two_hosts_never_cross_the_ceiling(redis_server):
    """4 threads on 2 hosts race 200 $0.01 reservations under a $0.50 ceiling: exactly 50 win."""
    a, b = host(redis_server.url), host(redis_server.url)
    day = window_id("day", time.time())
    won: list[str] = []

    def spend(store: RedisStore, name: str) -> None:
        for i in range(50):
            reservation = store.reserve_paid(
                day=day,
                amount=0.01,
                ceiling=0.5,
                lane="paid",
                model="m",
                job=f"{name}-{i}",
                cohort=None,
            )
            if reservation is not None:
                won.append(reservation)

    threads = [
        threading.Thread(target=spend, args=(s, f"t{i}")) for i, s in enumerate((a, b, a, b))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 50
    ledger = redis.Redis.from_url(redis_server.url, decode_responses=True)
    total = ledger.get(f"lanes:paid-total:{day}")
    assert total is not None  # the ledger's total key exists once anything was reserved
    assert sum(map(int, ledger.hvals(f"lanes:paid:{day}"))) == int(total) == 5 * 10**11
    jobs = {r.split(":")[3].split("-")[0] for r in won}  # ids: day:client tag:uuid:job:lane/model
    assert jobs >= {"t0", "t1"}  # both hosts got some
    # settling to the real (lower) cost frees budget for everyone after the next flush
    for reservation in won[:10]:
        a.settle_paid(reservation, 0.0) if reservation in a._own else b.settle_paid(
            reservation, 0.0
        )
    a.flush()
    b.flush()
    assert b.reserve_paid(
        day=day, amount=0.05, ceiling=0.5, lane="paid", model="m", job="late", cohort=None
    )
    b.begin_sync(time.time())
    assert b.paid_spent(day) == pytest.approx(0.45)


def test_kill_switch_grants_and_probe_results_are_published(redis_server):
    """Switches, grants, probe results reach the other host as events, and a lease is exclusive."""
    a, b = host(redis_server.url), host(redis_server.url)
    assert b.listen(0.05) == []  # subscribed
    now = time.time()
    assert a.probe_lease("groq/*", ttl_s=5.0) is True
    assert b.probe_lease("groq/*", ttl_s=5.0) is False  # one host probes for all
    a.put_switch("free", True, now)
    a.put_grant("ci", now + 3600, now)
    a.probe_done("groq/*", ok=True)
    a.flush()
    events = []
    for _ in range(20):
        events += b.listen(0.1)
        if len(events) >= 3:
            break
    assert [(e["t"], e.get("lane"), e.get("scope"), e.get("ok")) for e in events] == [
        ("grant", None, None, None),
        ("switch", "free", None, None),
        ("probe", None, "groq/*", True),
    ]
    assert b.grant_until("ci") == pytest.approx(now + 3600)
    assert b.switches() == {"free"}
    assert b.probe_lease("groq/*", ttl_s=5.0) is True  # the lease was released
    b.put_backoffs({"groq/*": backoff(now + 30)})
    lease = a.probe_lease("groq/*", ttl_s=5.0)
    assert isinstance(lease, Backoff) and lease.until == pytest.approx(now + 30)  # a closed door
    a.put_switch("free", False, now)
    a.flush()
    assert b.switches() == set()


def test_quarantine_is_shared_and_kept_while_redis_is_down(redis_server, tmp_path):
    """The canary's quarantine is shared; with Redis down the last view stands, verdicts wait."""
    a, b = host(redis_server.url), host(redis_server.url)
    a.set_quarantine("free/m", "drifted", "3 of 10 answers moved", at=1.0)
    assert "drifted" in b.quarantined()["free/m"]
    redis_server.kill()
    assert "drifted" in b.quarantined()["free/m"]  # the last view stands
    a.set_quarantine("free/n", "failed", "no answer", at=2.0)  # kept in the local file and queued
    assert a.local.quarantined().keys() == {"free/m", "free/n"}
    redis_server.start()
    a.begin_sync(time.time())
    a.flush()
    assert b.quarantined().keys() == {"free/n"}  # written when Redis came back


def test_redis_down_fails_fast_and_closes_the_ledger(redis_server):
    """Redis gone: calls fail fast; reservations refused until a full sync puts the ledger back."""
    store = host(redis_server.url)
    day = window_id("day", time.time())
    before = store.reserve_paid(
        day=day, amount=0.1, ceiling=1.0, lane="p", model="m", job="before", cohort=None
    )
    assert before
    redis_server.kill()
    started = time.monotonic()  # wall-clock: a refused connection must not hang
    with pytest.raises(StoreUnavailable, match="redis at redis://127.0.0.1"):
        store.begin_sync(time.time())
    assert time.monotonic() - started < 1.0  # wall-clock: as above
    assert not store.up
    with pytest.raises(StoreUnavailable):
        store.reserve_paid(
            day=day, amount=0.1, ceiling=1.0, lane="p", model="m", job="during", cohort=None
        )
    store.settle_paid(before, 0.05)  # queued, never lost
    redis_server.start()  # no persistence: Redis forgot everything
    with pytest.raises(StoreUnavailable, match="not synchronised"):
        store.reserve_paid(
            day=day, amount=0.1, ceiling=1.0, lane="p", model="m", job="early", cohort=None
        )
    assert store.begin_sync(time.time()) is True  # the loss is noticed
    store.reseed(
        LocalView(
            usage=[(("g/*", "requests", "day", day), 5)],
            spend={},
            backoffs={"g/*": backoff(time.time() + 60)},
            snapshots={},
            switched_off=frozenset({"free"}),
        ),
        time.time(),
    )
    store.flush()
    assert is_up(store)
    other = host(redis_server.url)
    assert other.paid_spent(day) == pytest.approx(0.05)  # our reservation is back, settled
    assert dict(other.usage_totals(time.time()))[("g/*", "requests", "day", day)] == 5
    assert [s for s, _ in other.backoffs(time.time())] == ["g/*"]
    assert other.switches() == {"free"}


def test_the_password_never_reaches_a_message():
    """A Redis password appears in no message or page."""
    assert redacted("redis://:s3cret-pass@10.0.0.5:6380/2") == "redis://10.0.0.5:6380/2"
    store = RedisStore("redis://:s3cret-pass@127.0.0.1:1/0", local=SQLiteStore(":memory:"))
    with pytest.raises(StoreUnavailable) as caught:
        store.begin_sync(time.time())
    assert "s3cret" not in str(caught.value) and "127.0.0.1:1" in str(caught.value)


def test_a_host_forgets_its_own_reservations_after_two_days(redis_server):
    """What a host keeps to push back after a Redis data loss does not grow for ever."""
    store = host(redis_server.url)
    today = window_id("day", time.time())
    for day in (today - 3, today - 1, today):
        store.reserve_paid(
            day=day, amount=0.01, ceiling=1.0, lane="p", model="m", job=f"j{day}", cohort=None
        )
    store.begin_sync(time.time())
    assert sorted(day for day, _ in store._own.values()) == [today - 1, today]


def test_settling_a_large_reservation_keeps_the_total_exact(redis_server):
    """A reservation of 16 digits of pico-dollars settles to the exact integer total."""
    store = host(redis_server.url)
    day = window_id("day", time.time())
    reservation = store.reserve_paid(
        day=day,
        amount=1234.567891234567,
        ceiling=5000.0,
        lane="p",
        model="m",
        job="big",
        cohort=None,
    )
    assert reservation is not None  # well under the ceiling
    store.settle_paid(reservation, 1.000000000001)
    store.flush()
    total = redis.Redis.from_url(redis_server.url).get(f"lanes:paid-total:{day}")
    assert total is not None
    assert int(total) == 1_000_000_000_001


def test_the_shared_ledger_matches_a_model_through_settlements_and_data_loss(redis_server):
    """Reservations, settlements and a Redis that forgets everything, on two hosts: the ledger's
    total is always the exact sum of its entries, never over the ceiling, and whole again after a
    reseed."""
    from hypothesis import settings
    from hypothesis import strategies as st
    from hypothesis.stateful import (
        RuleBasedStateMachine,
        invariant,
        rule,
        run_state_machine_as_test,
    )

    from lanes._core.state.redis_scripts import pico

    ceiling = 1.0
    day = window_id("day", time.time())
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)

    class Ledger(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            client.flushall()
            self.hosts = [host(redis_server.url), host(redis_server.url)]
            self.expected: dict[str, int] = {}  # reservation → pico-dollars it counts for
            self.owner: dict[str, int] = {}
            self.jobs = 0

        @rule(which=st.integers(0, 1), amount=st.floats(1e-6, 0.4))
        def reserve(self, which: int, amount: float) -> None:
            self.jobs += 1
            fits = sum(self.expected.values()) + pico(amount) <= round(ceiling * 1e12) + 1
            reservation = self.hosts[which].reserve_paid(
                day=day,
                amount=amount,
                ceiling=ceiling,
                lane="p",
                model="m",
                job=f"j{self.jobs}",
                cohort=None,
            )
            assert (reservation is not None) == fits
            if reservation:
                self.expected[reservation], self.owner[reservation] = pico(amount), which

        @rule(data=st.data(), share=st.floats(0.0, 1.0))
        def settle(self, data: st.DataObject, share: float) -> None:
            if self.expected:
                reservation = data.draw(
                    st.sampled_from(list(self.expected))
                )  # in reservation order
                store = self.hosts[self.owner[reservation]]
                cost = store._own[reservation][1] * share
                store.settle_paid(reservation, cost)
                store.flush()
                self.expected[reservation] = pico(cost)

        @rule()
        def forget_everything(self) -> None:
            client.flushall()  # a restart without persistence
            for store in self.hosts:
                with pytest.raises(StoreUnavailable):
                    store.up = False  # as a failed call would leave it
                    store.reserve_paid(
                        day=day,
                        amount=0.01,
                        ceiling=ceiling,
                        lane="p",
                        model="m",
                        job="x",
                        cohort=None,
                    )
                assert store.begin_sync(time.time())
                store.reseed(
                    LocalView(
                        usage=[], spend={}, backoffs={}, snapshots={}, switched_off=frozenset()
                    ),
                    time.time(),
                )
                store.flush()

        @invariant()
        def whole(self) -> None:
            entries = client.hgetall(f"lanes:paid:{day}")
            total = int(client.get(f"lanes:paid-total:{day}") or 0)
            assert {k: int(v) for k, v in entries.items()} == self.expected
            assert total == sum(self.expected.values()) <= round(ceiling * 1e12) + 1

        def teardown(self) -> None:
            for store in self.hosts:
                store.close()

    run_state_machine_as_test(
        Ledger, settings=settings(max_examples=25, stateful_step_count=25, deadline=None)
    )


def test_a_probe_lease_is_released_only_after_its_backoff_is_written(redis_server):
    """The probing host's backoff goes out with the lease release: no other host can take the lease
    in between, even when the sync that carries the backoff has not run yet."""
    a, b = host(redis_server.url), host(redis_server.url)
    assert b.listen(0.05) == []
    now = time.time()
    assert a.probe_lease("groq/*", ttl_s=5.0) is True
    a.probe_done(
        "groq/*", ok=False, backoff=backoff(now + 20)
    )  # the 429's backoff, not yet put by a sync
    a.flush()
    closed = b.probe_lease("groq/*", ttl_s=5.0)
    events: list[dict[str, Any]] = []
    for _ in range(20):
        events += b.listen(0.1)
        if len(events) >= 2:
            break
    assert isinstance(closed, Backoff) and closed.until == pytest.approx(now + 20)
    assert [e["t"] for e in events] == [
        "backoff",
        "probe",
    ]  # in this order: waiters wake to a closed door


def test_a_lost_state_is_reported_until_it_has_been_pushed_back(redis_server):
    """If the push-back after a data loss fails, the next sync asks for it again."""
    store = host(redis_server.url)
    redis.Redis.from_url(redis_server.url).flushall()
    assert store.begin_sync(time.time()) is True
    assert store.begin_sync(time.time()) is True  # no reseed yet (say it failed): still due
    store.reseed(
        LocalView(usage=[], spend={}, backoffs={}, snapshots={}, switched_off=frozenset()),
        time.time(),
    )
    assert store.begin_sync(time.time()) is False

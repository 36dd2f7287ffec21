"""The approvals' contract (`Approvals`), on both backends: pending approvals listed by every
process (or host) sharing the store, decided once by whichever decides first; an "approve once"
kept with its decision and consumed by exactly one request — the same rules for the SQLite file
and for Redis."""

from __future__ import annotations

import itertools
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import pytest

from helpers import examples
from lanes._core.state.approvals import OnceClaim
from lanes._core.state.store import ApprovalRecord, OnceConsent, SQLiteStore, Store

NOW = time.time()


def approval(expires_at: float, approval_id: str = "ap-1") -> ApprovalRecord:
    return ApprovalRecord(
        id=approval_id,
        client="nightly",
        fingerprint="f" * 64,
        exhausted=("free/m",),
        candidate="paid/p",
        estimated_cost_usd=0.002,
        created_at=NOW,
        expires_at=expires_at,
    )


@pytest.fixture(params=["sqlite", "redis"])
def fresh(request: pytest.FixtureRequest, tmp_path) -> Callable[[], tuple[Store, Store]]:
    """Makes two stores on one new, empty state: two processes on one SQLite file, or two hosts
    on one Redis (emptied first)."""
    if request.param == "sqlite":
        files = itertools.count()

        def pair() -> tuple[Store, Store]:
            path = str(tmp_path / f"state-{next(files)}.db")
            return SQLiteStore(path), SQLiteStore(path)

        return pair

    import redis

    from lanes._core.state.redis_store import RedisStore

    server = request.getfixturevalue("redis_server")

    def make() -> Store:
        store = RedisStore(server.url, local=SQLiteStore(":memory:"))
        store.begin_sync(NOW)
        store.flush()
        return store

    def hosts() -> tuple[Store, Store]:
        redis.Redis.from_url(server.url).flushall()
        return make(), make()

    return hosts


@pytest.fixture
def two(fresh: Callable[[], tuple[Store, Store]]) -> Iterator[tuple[Store, Store]]:
    """Two stores on one state: two processes on one SQLite file, or two hosts on one Redis."""
    a, b = fresh()
    yield a, b
    a.close()
    b.close()


def test_an_approval_written_by_one_is_listed_and_decided_once_by_another(two):
    """b lists a's approval; b's decision is kept and a sees it; deciding again is refused."""
    a, b = two
    a.put_approval(approval(NOW + 30), NOW)
    [listed] = b.approvals(NOW)
    assert listed == approval(NOW + 30)
    decided = b.decide_approval("ap-1", "once", NOW)
    assert decided is not None and decided.decision == "once" and decided.candidate == "paid/p"
    assert a.decide_approval("ap-1", "deny", NOW) is None
    assert [r.decision for r in a.approvals(NOW)] == ["once"]


def test_the_later_expiry_wins_and_a_decision_is_never_undone(two):
    """A job joining later extends the approval; a write after the decision changes nothing."""
    a, b = two
    a.put_approval(approval(NOW + 30), NOW)
    b.put_approval(approval(NOW + 10), NOW)
    assert [r.expires_at for r in a.approvals(NOW)] == [pytest.approx(NOW + 30)]
    b.decide_approval("ap-1", "deny", NOW)
    a.put_approval(approval(NOW + 60), NOW)
    [kept] = b.approvals(NOW)
    assert kept.decision == "deny" and kept.expires_at == pytest.approx(NOW + 30)


def test_an_expired_approval_is_neither_listed_nor_decided(two):
    """Once its last job's deadline passed, an approval is gone for everyone."""
    a, b = two
    a.put_approval(approval(NOW + 5), NOW)
    assert b.approvals(NOW + 6) == []
    assert b.decide_approval("ap-1", "once", NOW + 6) is None
    assert b.decide_approval("ap-unknown", "once", NOW) is None


def take(store: Store, **changes: object) -> str | None:
    """`take_once` for the request `approval()` asked for, with `changes` to its arguments."""
    asked: dict[str, Any] = dict(
        client="nightly", candidate="paid/p", fingerprint="f" * 64, cost=0.002, approval=None
    )
    return store.claim_once(OnceClaim(**{**asked, "now": NOW, **changes}))


def test_a_once_decision_keeps_the_request_model_and_worst_case_it_approved(two):
    """Deciding "once" keeps, in the same step, a once another process lists with the approved
    request, model and worst case; it pays for nothing else — another client, model, request, or
    a larger worst case — and for that request exactly once."""
    a, b = two
    a.put_approval(approval(NOW + 30), NOW)
    b.decide_approval("ap-1", "once", NOW, NOW + 600)
    [kept] = a.onces(NOW)
    assert kept == OnceConsent(
        id="ap-1",
        client="nightly",
        fingerprint="f" * 64,
        candidate="paid/p",
        until=kept.until,
        cost_usd=0.002,
    )
    assert kept.until == pytest.approx(NOW + 600)
    assert take(a, client="adhoc") is None
    assert take(a, candidate="paid/q") is None
    assert take(a, fingerprint="e" * 64) is None
    assert take(a, cost=0.0021) is None
    assert take(b, cost=0.0015, approval="ap-1") == "ap-1"
    assert take(a) is None and a.onces(NOW) == []


def test_a_deny_or_an_undecided_approval_keeps_no_once(two):
    """Only "once" keeps a once; a decision the store refuses (already decided) keeps none."""
    a, b = two
    a.put_approval(approval(NOW + 30), NOW)
    b.decide_approval("ap-1", "deny", NOW, NOW + 600)
    assert a.decide_approval("ap-1", "once", NOW, NOW + 600) is None
    assert a.onces(NOW) == [] and take(b) is None


def race(stores: list[Store], **changes: object) -> list[str | None]:
    """`take(store, **changes)` from every store in `stores` at the same moment, one thread
    each."""
    start = threading.Barrier(len(stores))
    taken: list[str | None] = []

    def racer(store: Store) -> None:
        start.wait()
        taken.append(take(store, **changes))

    threads = [threading.Thread(target=racer, args=(s,)) for s in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return taken


def test_two_processes_racing_for_one_once_consume_it_once(two):
    """Four takers — two threads on each of two processes (or hosts) — race for each of twenty
    onces: every once is consumed by exactly one of them."""
    a, b = two
    for i in range(20):
        a.put_approval(approval(NOW + 30, f"ap-{i}"), NOW)
        b.decide_approval(f"ap-{i}", "once", NOW, NOW + 600)
        taken = race([a, b, a, b])
        assert len(taken) == 4 and [t for t in taken if t is not None] == [f"ap-{i}"]


def test_an_expired_once_pays_for_nothing(two):
    """A once past its `until` is neither listed nor taken."""
    a, b = two
    a.put_approval(approval(NOW + 30), NOW)
    b.decide_approval("ap-1", "once", NOW, NOW + 5)
    assert a.onces(NOW + 6) == [] and take(a, now=NOW + 6) is None


def test_a_once_kept_without_its_estimate_pays_for_nothing(two):
    """A once with no approved worst case (as an older version kept it) is listed, so it can be
    revoked, but matches no request."""
    a, b = two
    legacy = OnceConsent(
        id="ap-old", client="nightly", fingerprint="f" * 64, candidate="paid/p", until=NOW + 600
    )
    a.put_once(legacy)
    assert b.onces(NOW) == [legacy]
    assert take(b, approval="ap-old") is None and take(b, cost=0.0) is None
    assert b.drop_once("ap-old") and a.onces(NOW) == []


def test_an_older_state_files_once_pays_for_nothing(tmp_path):
    """A state file written before onces kept their estimate: opening it adds the column, and its
    once — listed, revocable — matches no request."""
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as old:
        old.execute(
            "CREATE TABLE once_consent "
            "(id TEXT PRIMARY KEY, client TEXT, fingerprint TEXT, candidate TEXT, until FLOAT)"
        )
        old.execute(
            "INSERT INTO once_consent VALUES (?, ?, ?, ?, ?)",
            ("ap-old", "nightly", "f" * 64, "paid/p", NOW + 600),
        )
    store = SQLiteStore(str(path))
    try:
        assert [o.cost_usd for o in store.onces(NOW)] == [None]
        assert take(store, approval="ap-old") is None and take(store, cost=0.0) is None
    finally:
        store.close()


def test_a_redis_once_kept_without_its_estimate_pays_for_nothing(redis_server):
    """On Redis, a once an older version kept (no `cost_usd`) is listed and matches nothing."""
    from lanes._core.state.redis_store import RedisStore

    store = RedisStore(redis_server.url, local=SQLiteStore(":memory:"))
    try:
        store.begin_sync(NOW)
        old: dict[str, Any] = {"id": "ap-old", "client": "nightly", "fingerprint": "f" * 64}
        old |= {"candidate": "paid/p", "until": NOW + 600}
        store._redis.hset(store._k("once"), "ap-old", json.dumps(old))
        assert [o.cost_usd for o in store.onces(NOW)] == [None]
        assert take(store, approval="ap-old") is None and take(store, cost=0.0) is None
    finally:
        store.close()


def test_a_retry_is_told_why_the_once_it_names_can_not_pay():
    """The reason a 429 gives a retry whose `X-Lanes-Approval` can not pay: nothing kept by that
    id, a once kept without its estimate, another model, another request, a larger worst case —
    and none when it can (the same rule as `take_once`)."""
    from lanes._core.money.consent import why_not

    once = OnceConsent(
        id="ap-1",
        client="nightly",
        fingerprint="f" * 64,
        candidate="paid/p",
        until=NOW + 600,
        cost_usd=0.002,
    )
    asked: dict[str, Any] = {"candidate": "paid/p", "fingerprint": "f" * 64, "cost": 0.002}
    assert why_not(once, **asked) == "" and why_not(once, **{**asked, "cost": 0.001}) == ""
    assert why_not(None, **asked).startswith("no unused approval by that id")
    legacy = attrs.evolve(once, cost_usd=None)
    assert why_not(legacy, **asked) == "it was kept without its estimate (by an older version)"
    assert why_not(once, **{**asked, "candidate": "paid/q"}) == "it approved paid/p, not paid/q"
    assert "another request" in why_not(once, **{**asked, "fingerprint": "e" * 64})
    assert why_not(once, **{**asked, "cost": 0.003}) == (
        "this request may cost $0.003000, more than the $0.002000 approved"
    )


CLIENTS, REQUESTS, MODELS = ("nightly", "adhoc"), ("f" * 64, "e" * 64), ("paid/p", "paid/q")
COSTS = (0.001, 0.002, 0.003)
TTL_S = 600.0


def test_a_once_is_never_consumed_twice(fresh):
    """Any interleaving of approvals decided once (or denied, or decided twice), takers on either
    process or host — alone or racing each other, for any client, request, model, worst case and
    named approval — revocations and time passing: a once is taken at most once, only by a request
    it matches (the named one first), and only while it is kept; and a taker finds one whenever
    one it matches is kept."""
    from hypothesis import settings
    from hypothesis import strategies as st
    from hypothesis.stateful import (
        RuleBasedStateMachine,
        invariant,
        rule,
        run_state_machine_as_test,
    )

    consumed: list[str] = []  # every once taken, over every run
    ask: dict[str, st.SearchStrategy[Any]] = {
        "client": st.sampled_from(CLIENTS),
        "fingerprint": st.sampled_from(REQUESTS),
        "candidate": st.sampled_from(MODELS),
        "cost": st.sampled_from(COSTS),
    }

    class Onces(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.stores = fresh()
            self.now = NOW
            self.kept: dict[str, OnceConsent] = {}  # the model: onces decided, not yet used
            self.used: set[str] = set()
            self.decided: list[str] = []
            self.expired: set[str] = set()
            self.asked: dict[str, dict[str, Any]] = {}  # what each approval was asked for

        def teardown(self) -> None:
            for store in self.stores:
                store.close()

        @rule(asker=st.integers(0, 1), once=st.booleans(), asked=st.fixed_dictionaries(ask))
        def decide(self, asker: int, once: bool, asked: dict[str, Any]) -> None:
            approval_id = f"ap-{len(self.decided)}"
            record = ApprovalRecord(
                id=approval_id,
                client=asked["client"],
                fingerprint=asked["fingerprint"],
                exhausted=(),
                candidate=asked["candidate"],
                estimated_cost_usd=asked["cost"],
                created_at=self.now,
                expires_at=self.now + 30,
            )
            self.stores[asker].put_approval(record, self.now)
            word = "once" if once else "deny"
            decided = self.stores[1 - asker].decide_approval(
                approval_id, word, self.now, self.now + TTL_S
            )
            assert decided is not None and decided.decision == word
            self.decided.append(approval_id)
            self.asked[approval_id] = asked
            if once:
                self.kept[approval_id] = OnceConsent(
                    id=approval_id,
                    client=record.client,
                    fingerprint=record.fingerprint,
                    candidate=record.candidate,
                    until=self.now + TTL_S,
                    cost_usd=record.estimated_cost_usd,
                )

        @rule(which=st.integers(0, 1), data=st.data())
        def decide_again(self, which: int, data: st.DataObject) -> None:
            """A second decision — "once" included — is refused and keeps no second once."""
            if self.decided:
                approval_id = data.draw(st.sampled_from(self.decided))
                again = self.stores[which].decide_approval(
                    approval_id, "once", self.now, self.now + TTL_S
                )
                assert again is None

        def matching(self, asked: dict[str, Any]) -> set[str]:
            return {
                o.id
                for o in self.kept.values()
                if (o.client, o.fingerprint, o.candidate)
                == (asked["client"], asked["fingerprint"], asked["candidate"])
                and asked["cost"] <= (o.cost_usd or 0.0)
            }

        def taken(self, got: list[str | None], asked: dict[str, Any], named: str | None) -> None:
            """Check what takers asking `asked` (naming `named`) got, and update the model."""
            ids = [g for g in got if g is not None]
            assert not set(ids) & self.used, ids  # never consumed twice
            matching = self.matching(asked)
            assert len(ids) == min(len(got), len(matching)) and len(set(ids)) == len(ids)
            assert set(ids) <= matching
            if named in matching:
                assert named in ids  # the named one first
            consumed.extend(ids)
            for taken in ids:
                del self.kept[taken]
                self.used.add(taken)

        def request(self, data: st.DataObject) -> dict[str, Any]:
            """A request to take a once for: mostly one an approval was asked for (kept, used,
            denied or expired), some field of it maybe changed; else any."""
            asked = data.draw(st.fixed_dictionaries(ask))
            mostly = data.draw(st.integers(0, 3)) > 0
            if self.asked and mostly:
                like = data.draw(st.sampled_from(sorted(self.asked.items())))[1]
                changed = data.draw(st.sampled_from([None, *ask]))
                asked = {**like, **({changed: asked[changed]} if changed else {})}
            return asked

        @rule(which=st.integers(0, 1), data=st.data())
        def take(self, which: int, data: st.DataObject) -> None:
            asked = self.request(data)
            named = data.draw(st.sampled_from([None, "ap-unknown", *self.asked]))
            args = {**asked, "approval": named}
            self.taken([take(self.stores[which], now=self.now, **args)], asked, named)

        @rule(data=st.data())
        def race(self, data: st.DataObject) -> None:
            """Four takers, two on each process or host, asking at the same moment."""
            a, b = self.stores
            asked = self.request(data)
            self.taken(race([a, b, a, b], now=self.now, approval=None, **asked), asked, None)

        @rule(which=st.integers(0, 1), data=st.data())
        def revoke(self, which: int, data: st.DataObject) -> None:
            if self.decided:
                once_id = data.draw(st.sampled_from(self.decided))
                dropped = self.stores[which].drop_once(once_id)
                if once_id not in self.expired:  # an expired one may linger until a take
                    assert dropped == (once_id in self.kept)
                self.kept.pop(once_id, None)

        @rule(seconds=st.sampled_from([1.0, 100.0, 400.0]))
        def time_passes(self, seconds: float) -> None:
            self.now += seconds
            self.expired |= {i for i, o in self.kept.items() if o.until <= self.now}
            self.kept = {i: o for i, o in self.kept.items() if o.until > self.now}

        @invariant()
        def listed(self) -> None:
            """Both list exactly the onces kept."""
            for store in self.stores:
                assert {o.id: o for o in store.onces(self.now)} == self.kept

    run_state_machine_as_test(
        Onces, settings=settings(max_examples=examples(30), stateful_step_count=30, deadline=None)
    )
    assert consumed  # the runs did consume onces, so the checks above checked something

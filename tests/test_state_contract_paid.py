"""The paid ledger's contract (`PaidLedger`), on both backends: several processes on one SQLite
file, or several hosts on one Redis. Each rule is one atomic step across all of them: a
reservation never takes the day over the ceiling (nor a client over its own), settling frees what
the attempt did not cost, and a state that lost its data gets every process's reservations back
before paid reopens."""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from state_backends import BACKENDS, State, open_state, resync, sync

from helpers import examples
from lanes._core.freetier.windows import window_id
from lanes._core.state.paid import PaidAsk
from lanes._core.state.store import Store, StoreUnavailable

DAY = window_id("day", time.time())  # today: Redis expires a day's ledger after its end
EPS = 1e-9


@pytest.fixture(params=BACKENDS)
def state(request, tmp_path):
    with open_state(request, tmp_path) as state:
        yield state


def reserve(store: Store, amount: float, ceiling: float = 1.0, **more: Any) -> str | None:
    asked: dict[str, Any] = {"lane": "p", "model": "m", "job": "j", "cohort": None}
    return store.reserve(PaidAsk(day=DAY, amount=amount, ceiling=ceiling, **{**asked, **more}))


def entries(state: State, day: int = DAY) -> dict[str, float]:
    """Every reservation of `day` as the state holds it: what it counts for (USD)."""
    if state.url is None:
        store = state.stores[0]
        rows = store.records.query(
            "SELECT id, COALESCE(settled, reserved) FROM paid_ledger WHERE day = ?", (day,)
        )
        summed = math.fsum(usd for _, usd in rows)  # the running totals are the rows' sum
        assert math.isclose(store.paid_spent(day), summed, rel_tol=1e-15, abs_tol=1e-15)
        return {reservation: usd for reservation, usd in rows}
    client = state._redis()
    held = {r: int(pico) for r, pico in client.hgetall(f"lanes:paid:{day}").items()}
    assert int(client.get(f"lanes:paid-total:{day}") or 0) == sum(held.values())  # exact total
    return {r: pico / 1e12 for r, pico in held.items()}


def test_reservations_racing_from_two_stores_never_cross_the_ceiling(state):
    """Four threads on two processes (hosts), started together, race 200 $0.01 reservations
    under a $0.50 ceiling: none fails, exactly 50 win, and the state holds exactly those."""
    a, b = state.pair()
    won: list[str] = []
    failed: list[BaseException] = []
    start = threading.Barrier(4)

    def spend(store: Store, name: str) -> None:
        try:
            start.wait()
            for i in range(50):
                reservation = reserve(store, 0.01, ceiling=0.5, job=f"{name}-{i}")
                if reservation is not None:
                    won.append(reservation)
        except Exception as exc:  # reported below: a thread's error is not the test's otherwise
            failed.append(exc)

    threads = [threading.Thread(target=spend, args=(s, f"t{i}")) for i, s in enumerate((a, b) * 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert failed == [] and len(won) == 50
    assert sorted(entries(state)) == sorted(won)
    assert sum(entries(state).values()) == pytest.approx(0.5)


def test_settling_frees_what_the_attempt_did_not_cost_for_everyone(state):
    """A reservation counts in full until settled; its settlement is what counts afterwards, for
    every process (host), and the freed budget can be reserved by another."""
    a, b = state.pair()
    reservation = reserve(a, 0.6)
    assert reservation is not None
    assert reserve(b, 0.5) is None  # 0.6 counts in full: 1.1 would cross
    a.settle_paid(reservation, 0.1)
    sync(a, b)
    assert b.paid_spent(DAY) == pytest.approx(0.1)
    assert reserve(b, 0.5) is not None
    sync(a, b)
    assert a.paid_spent(DAY) == pytest.approx(0.6)


def test_a_clients_ceiling_holds_inside_the_global_one(state):
    """A client with a ceiling of its own is held to it, across stores, and to the global one."""
    a, b = state.pair()
    assert reserve(a, 0.3, client="ci", client_ceiling=0.5) is not None
    assert reserve(b, 0.3, client="ci", client_ceiling=0.5) is None  # 0.6 > the client's 0.5
    assert b.paid_spent(DAY, "ci") == pytest.approx(0.3)
    assert reserve(b, 0.2, client="ci", client_ceiling=0.5) is not None  # exactly 0.5
    assert reserve(a, 0.6, client="web", client_ceiling=5.0) is None  # 1.1 > the global 1.0
    assert reserve(a, 0.5, client="web", client_ceiling=5.0) is not None


def test_a_lost_state_closes_paid_until_every_reservation_is_back(state):
    """A state that lost its data (file deleted, Redis restarted empty) refuses reservations until
    each store's next sync has written its own back — settled ones at their cost — so the ceiling
    still holds across the loss."""
    a, b = state.pair()
    first, second = reserve(a, 0.3), reserve(b, 0.4)
    assert first is not None and second is not None
    a.settle_paid(first, 0.2)
    sync(a, b)
    state.forget()
    for store in (a, b):
        with pytest.raises(StoreUnavailable):
            reserve(store, 0.01)
    assert resync(a) and resync(b)
    assert not resync(a)  # pushed back: no more reseeds
    sync(a, b)
    assert a.paid_spent(DAY) == pytest.approx(0.6)
    assert reserve(b, 0.5) is None and reserve(b, 0.4) is not None


def test_the_ledger_matches_a_model_through_any_interleaving_and_data_loss(state):
    """Reservations, settlements and losses of the whole state, from two processes (hosts) in any
    order: spent plus reserved never exceeds the ceiling, a refusal means the amount really would
    cross it, spent never falls below what was settled, and the state holds exactly the model's
    reservations — after a loss too."""
    run_state_machine_as_test(
        lambda: Ledger(state),  # type: ignore[arg-type]  # hypothesis takes any factory
        settings=settings(max_examples=examples(30), stateful_step_count=25, deadline=None),
    )


class Ledger(RuleBasedStateMachine):
    ceiling = 1.0

    def __init__(self, state: State) -> None:
        super().__init__()
        state.close()
        state.fresh()
        self.state = state
        self.stores = list(state.pair())
        self.counts: dict[str, float] = {}  # reservation → what it counts for: amount, or cost
        self.settled: dict[str, float] = {}
        self.owner: dict[str, int] = {}
        self.jobs = 0

    @rule(which=st.integers(0, 1), amount=st.floats(0.0, 0.6))
    def reserve(self, which: int, amount: float) -> None:
        self.jobs += 1
        before = sum(self.counts.values())
        reservation = reserve(self.stores[which], amount, self.ceiling, job=f"j{self.jobs}")
        if reservation is None:
            assert before + amount > self.ceiling - EPS  # refused only when it would cross
            return
        assert before + amount <= self.ceiling + EPS
        self.counts[reservation], self.owner[reservation] = amount, which

    @rule(data=st.data(), share=st.floats(0.0, 1.0))
    def settle(self, data: st.DataObject, share: float) -> None:
        unsettled = [r for r in self.counts if r not in self.settled]
        if unsettled:  # an attempt settles once, never above what it reserved
            reservation = data.draw(st.sampled_from(unsettled))
            cost = self.counts[reservation] * share
            self.stores[self.owner[reservation]].settle_paid(reservation, cost)
            self.counts[reservation] = self.settled[reservation] = cost

    @rule()
    def lose_everything(self) -> None:
        self.state.forget()
        for store in self.stores:
            with pytest.raises(StoreUnavailable):
                reserve(store, 0.0, self.ceiling, job="during")
        for store in self.stores:
            assert resync(store)

    @invariant()
    def whole(self) -> None:
        sync(*self.stores)
        held = entries(self.state)
        assert held == pytest.approx(self.counts, abs=EPS)
        for store in self.stores:
            spent = store.paid_spent(DAY)
            assert sum(self.settled.values()) - EPS <= spent <= self.ceiling + EPS
            assert spent == pytest.approx(sum(self.counts.values()), abs=EPS)

    def teardown(self) -> None:
        self.state.close()

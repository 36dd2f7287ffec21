"""The paid ledger as a state machine: reservations and settlements from two store connections on
one file (two processes), in any interleaving, never take spend over the ceiling."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from lanes._core.state.store import SQLiteStore

CEILING = 1.0
DAY = 20_000


class Ledger(RuleBasedStateMachine):
    reservations = Bundle("reservations")

    @initialize()
    def open_stores(self) -> None:
        self.dir = tempfile.TemporaryDirectory()
        path = str(Path(self.dir.name) / "ledger.db")
        self.stores = [SQLiteStore(path), SQLiteStore(path)]  # two "processes"
        self.live: dict[str, float] = {}  # reservation → amount reserved, not yet settled
        self.count = 0

    def teardown(self) -> None:
        for store in self.stores:
            store.close()
        self.dir.cleanup()

    @rule(target=reservations, which=st.integers(0, 1), amount=st.floats(0.0, 0.6))
    def reserve(self, which: int, amount: float) -> str:
        self.count += 1
        before = self.stores[0].paid_spent(DAY)
        reservation = self.stores[which].reserve_paid(
            day=DAY,
            amount=amount,
            ceiling=CEILING,
            lane="p",
            model="m",
            job=f"j{self.count}",
            cohort=None,
        )
        if reservation is None:
            assert before + amount > CEILING  # refused only when it would really cross
            return "refused"
        self.live[reservation] = amount
        return reservation

    @precondition(lambda self: self.live)
    @rule(which=st.integers(0, 1), reservation=reservations, fraction=st.floats(0.0, 1.0))
    def settle(self, which: int, reservation: str, fraction: float) -> None:
        if reservation in self.live:  # a real attempt never costs more than its worst case
            self.stores[which].settle_paid(reservation, self.live.pop(reservation) * fraction)

    @invariant()
    def never_over_the_ceiling(self) -> None:
        if hasattr(self, "stores"):
            for store in self.stores:
                assert store.paid_spent(DAY) <= CEILING + 1e-9


TestLedger = Ledger.TestCase
TestLedger.settings = settings(
    max_examples=40, stateful_step_count=25, deadline=None, derandomize=True
)

"""The SQLite state file: a concurrent first open is safe; a file deleted or replaced under a
running process is noticed, closes paid, and is reopened with this process's view written
back."""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import random
import sqlite3
import traceback
import uuid
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

import lanes
from helpers import config, examples, paid_lane, store_up
from lanes._core.freetier.backoff import Backoff
from lanes._core.state.paid import PaidAsk
from lanes._core.state.store import LocalView, SQLiteStore, StoreUnavailable
from lanes.testing import open_fake

DAY = 20_000
NOW = DAY * 86400.0 + 3600.0


def _open_and_write(path: str, barrier, results) -> None:
    try:
        barrier.wait(timeout=30)
        store = SQLiteStore(path)
        store.put_switch("lane-a", True, 1.0)
        reservation = store.reserve(
            PaidAsk(day=DAY, amount=0.01, ceiling=10.0, lane="p", model="m", job="j", cohort=None)
        )
        assert reservation is not None
        store.close()
        results.put("")
    except BaseException:
        results.put(traceback.format_exc())


def _at_once(context: Any, target: Any, path: Any) -> tuple[list[str], list[int | None]]:
    """Eight processes running `target(path, barrier, results)` at the same instant: the failures
    they reported, and their exit codes."""
    barrier, results = context.Barrier(8), context.Queue()
    processes = [context.Process(target=target, args=(path, barrier, results)) for _ in range(8)]
    for process in processes:
        process.start()
    failures = [failure for failure in (results.get(timeout=60) for _ in processes) if failure]
    for process in processes:
        process.join(timeout=30)
    return failures, [p.exitcode for p in processes]


@pytest.mark.slow  # 160 forked processes
def test_eight_processes_create_one_new_file_at_once(tmp_path):
    """Eight processes opening one new state file at the same instant, twenty times: every one
    opens it, writes to it, and the eight reservations are all there."""
    context = multiprocessing.get_context("fork")
    for round_ in range(20):
        path = str(tmp_path / f"round-{round_}" / "state.db")
        failures, exits = _at_once(context, _open_and_write, path)
        assert not failures, f"round {round_}: {failures[0]}"
        assert exits == [0] * 8
        store = SQLiteStore(path)
        assert store.paid_spent(DAY) == pytest.approx(0.08)
        store.close()


def _delete(path: Path) -> None:
    """What `rm state.db*` does."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def _view(**kw) -> LocalView:
    return LocalView(
        usage=kw.get("usage", []),
        spend=kw.get("spend", {}),
        backoffs=kw.get("backoffs", {}),
        snapshots={},
        switched_off=kw.get("switched_off", frozenset()),
    )


def _reserve(store: SQLiteStore, amount: float) -> str | None:
    return store.reserve(
        PaidAsk(day=DAY, amount=amount, ceiling=1.0, lane="p", model="m", job="j", cohort=None)
    )


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_state_file_deleted_or_replaced_closes_paid_until_reopened(tmp_path, how):
    """Deleting or replacing the file under a store: paid reservations are refused at once; the
    next sync opens the file at the path and writes this process's view and its own reservations
    back into it, and paid reopens — so two processes end on one ledger, not two."""
    path = tmp_path / "state.db"
    store = SQLiteStore(str(path))
    reservation = _reserve(store, 0.3)
    assert reservation is not None
    store.settle_paid(reservation, 0.2)
    if how == "deleted":
        _delete(path)
    else:
        other = tmp_path / "other.db"
        SQLiteStore(str(other)).close()
        os.replace(other, path)
    with pytest.raises(StoreUnavailable, match=f"state file was {how}"):
        _reserve(store, 0.1)
    assert (store.up, store.lost_reason) == (False, f"the state file was {how}")
    view = _view(
        usage=[(("lane/m", "requests", "day", DAY), 7)],
        spend={("lane", 0): 0.5},
        backoffs={"lane/m": Backoff(until=NOW + 60, step=1, reason="rate_limited", source="x")},
        switched_off=frozenset({"lane-b"}),
    )
    assert store.begin_sync(NOW) is True
    with pytest.raises(StoreUnavailable):
        _reserve(store, 0.1)  # not before the view is back
    store.reseed(view, NOW)
    assert (store.up, store.begin_sync(NOW)) == (True, False)
    assert store.paid_spent(DAY) == pytest.approx(0.2)  # our settled reservation came back
    assert _reserve(store, 0.9) is None  # so the ceiling still holds across the loss
    assert _reserve(store, 0.1) is not None
    second = SQLiteStore(str(path))  # another process opening the path shares this ledger
    assert second.paid_spent(DAY) == pytest.approx(0.3)
    assert second.switches() == {"lane-b"}
    assert second.usage_totals(DAY * 86400.0) == [(("lane/m", "requests", "day", DAY), 7)]
    assert [scope for scope, _ in second.backoffs(NOW)] == ["lane/m"]
    second.close()
    store.close()


def test_an_unchanged_file_needs_no_reseed(tmp_path):
    """A file left alone is never reseeded; a memory store has no file to check."""
    store = SQLiteStore(str(tmp_path / "state.db"))
    assert store.begin_sync(NOW) is False and store.up
    memory = SQLiteStore(":memory:")
    assert memory.begin_sync(NOW) is False and memory.up


async def test_a_running_dispatcher_notices_its_state_file_deleted(tmp_path, env, caplog_lanes):
    """Deleting the state file under a running dispatcher: paid is refused at once (one line says
    so), and at the next sync the file is back with the paid spend in it and paid reopens (one
    line)."""
    path = tmp_path / "state.db"
    async with open_fake("paid", models=("paid-model",)) as paid:
        cfg = config(paid_lane("paid", paid.base_url), state=str(path))
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
            job = lanes.Job(messages=[{"role": "user", "content": "hi"}], params={"max_tokens": 10})
            first = await dispatcher.complete(job)
            _delete(path)
            with pytest.raises(lanes.PaidBudgetExhausted):
                await dispatcher.complete(job)
            await store_up(dispatcher, 5)
            second = await dispatcher.complete(job)
            spent = dispatcher.paid_spent_today()
    assert path.exists() and len(paid.requests()) == 2
    assert spent == pytest.approx(first.cost_usd + second.cost_usd)
    lines = [r.getMessage() for r in caplog_lanes.records]
    closed = [line for line in lines if "deleted" in line and "paid fallback closed" in line]
    reopened = [line for line in lines if "deleted" in line and "written back" in line]
    assert len(closed) == 1 and len(reopened) == 1, lines


# The paid ledger's running totals (`paid_totals`): kept by triggers, filled once from an old file.

OLD_LEDGER = (  # `paid_ledger` as the first release made it: no client, no totals
    "CREATE TABLE paid_ledger (id TEXT PRIMARY KEY, day INTEGER, reserved FLOAT, settled FLOAT, "
    "lane TEXT, model TEXT, job TEXT, cohort TEXT)"
)


def _old_file(path: Path, rows: list[tuple[str, int, float, float | None]]) -> None:
    """A state file made by a version without totals: its ledger's rows (id, day, reserved,
    settled), nothing else."""
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute(OLD_LEDGER)
        db.executemany(
            "INSERT INTO paid_ledger (id, day, reserved, settled, lane, model, job) "
            "VALUES (?, ?, ?, ?, 'p', 'm', 'j')",
            rows,
        )


def _totals_match_rows(path: Path) -> dict[tuple[int, int, str], Fraction]:
    """Every totals row equals the exact sum of its ledger rows, to a few ulps of their size;
    no ledger row is without one. The rows' sums, exactly."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        rows = db.execute(
            "SELECT day, client IS NOT NULL, IFNULL(client, ''), COALESCE(settled, reserved, 0) "
            "FROM paid_ledger"
        ).fetchall()
        totals = {
            (day, named, client): (spent, carry)
            for day, named, client, spent, carry in db.execute("SELECT * FROM paid_totals")
        }
    exact: dict[tuple[int, int, str], Fraction] = {}
    size: dict[tuple[int, int, str], float] = {}
    for *key, usd in rows:
        exact[tuple(key)] = exact.get(tuple(key), Fraction(0)) + Fraction(usd)
        size[tuple(key)] = size.get(tuple(key), 0.0) + abs(usd)
    assert set(exact) <= set(totals)
    for key, (spent, carry) in totals.items():
        off = abs(Fraction(spent) + Fraction(carry) - exact.get(key, Fraction(0)))
        assert off <= Fraction(4 * 2**-53) * max(1.0, size.get(key, 0.0)), (key, float(off))
    return exact


def test_an_older_file_gains_its_totals_once(tmp_path):
    """A ledger made before the totals (no client column either) gets them from its rows when
    first opened — settled rows at their cost — and a second open does not add them again."""
    path = tmp_path / "state.db"
    _old_file(path, [("a", DAY, 0.3, 0.1), ("b", DAY, 0.25, None), ("c", DAY - 1, 0.7, None)])
    first, second = SQLiteStore(str(path)), SQLiteStore(str(path))
    assert first.paid_spent(DAY) == second.paid_spent(DAY) == pytest.approx(0.35)
    assert second.paid_spent(DAY - 1) == pytest.approx(0.7)
    assert _reserve(first, 0.66) is None and _reserve(second, 0.65) is not None  # 0.35 + 0.65
    assert _totals_match_rows(path) == {
        (DAY, 0, ""): Fraction(0.1) + Fraction(0.25) + Fraction(0.65),
        (DAY - 1, 0, ""): Fraction(0.7),
    }
    first.close()
    second.close()


def _open_old_and_reserve(path: str, barrier, results) -> None:
    try:
        barrier.wait(timeout=30)
        store = SQLiteStore(path)
        assert _reserve(store, 0.01) is not None
        store.close()
        results.put("")
    except BaseException:
        results.put(traceback.format_exc())


@pytest.mark.slow  # 40 forked processes
def test_eight_processes_opening_an_older_file_at_once_fill_its_totals_once(tmp_path):
    """Eight processes opening one older file at the same instant, five times: the totals are its
    rows' once, plus the eight reservations."""
    context = multiprocessing.get_context("fork")
    for round_ in range(5):
        path = tmp_path / f"round-{round_}.db"
        _old_file(path, [("a", DAY, 0.2, None), ("b", DAY, 0.3, 0.05)])
        failures, _ = _at_once(context, _open_old_and_reserve, str(path))
        assert not failures, f"round {round_}: {failures[0]}"
        store = SQLiteStore(str(path))
        assert store.paid_spent(DAY) == pytest.approx(0.25 + 8 * 0.01)
        store.close()
        _totals_match_rows(path)


def test_many_settlements_do_not_drift_the_totals(tmp_path):
    """Three thousand reservations, each settled lower, on one day: the running total stays
    within a few ulps of the exact sum of the rows (a plain running sum drifts past that)."""
    path = tmp_path / "state.db"
    store, rng = SQLiteStore(str(path)), random.Random(7)
    for i in range(3000):
        amount = rng.uniform(0.0, 0.05)
        reservation = store.reserve(
            PaidAsk(
                day=DAY, amount=amount, ceiling=1e6, lane="p", model="m", job=f"j{i}", cohort=None
            )
        )
        assert reservation is not None
        store.settle_paid(reservation, amount * rng.random())
    (exact,) = _totals_match_rows(path).values()
    assert abs(Fraction(store.paid_spent(DAY)) - exact) <= Fraction(2 * 2**-53) * float(exact)
    store.close()


CLIENTS = st.sampled_from([None, "", "ci", "web"])


class Totals(RuleBasedStateMachine):
    """Two processes on one file reserve (with and without a client's ceiling), settle, have a row
    deleted by an operator, and see the file replaced — by a fresh file, a copy of itself or an
    older version's file with rows of its own — and write their reservations back: the totals
    always equal the rows, the rows are the model's, and spend reads the model's sums."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder / uuid.uuid4().hex
        self.folder.mkdir()
        self.path = self.folder / "state.db"
        self.stores = [SQLiteStore(str(self.path)), SQLiteStore(str(self.path))]
        self.rows: dict[str, tuple[str | None, float]] = {}  # id → (client, what it counts)
        self.own: list[dict[str, tuple[str | None, float]]] = [{}, {}]  # each store's
        self.jobs = 0

    @rule(which=st.integers(0, 1), amount=st.floats(0.0, 0.4), client=CLIENTS, own=st.booleans())
    def reserve(self, which: int, amount: float, client: str | None, own: bool) -> None:
        self.jobs += 1
        reservation = self.stores[which].reserve(
            PaidAsk(
                day=DAY,
                amount=amount,
                ceiling=2.0,
                lane="p",
                model="m",
                job=f"j{self.jobs}",
                cohort=None,
                client=client,
                client_ceiling=1.0 if own else None,
            )
        )
        total = math.fsum(usd for _, usd in self.rows.values())
        mine = math.fsum(usd for c, usd in self.rows.values() if c == client or client is None)
        if reservation is None:  # refused only when it would cross one of the ceilings
            assert total + amount > 2.0 - 1e-9 or (own and mine + amount > 1.0 - 1e-9)
            return
        assert total + amount <= 2.0 + 1e-9 and (not own or mine + amount <= 1.0 + 1e-9)
        self.rows[reservation] = self.own[which][reservation] = (client, amount)

    @rule(data=st.data(), share=st.floats(0.0, 1.0))
    def settle(self, data: st.DataObject, share: float) -> None:
        which = data.draw(st.integers(0, 1))
        if self.own[which]:
            reservation = data.draw(st.sampled_from(sorted(self.own[which])))
            client, usd = self.own[which][reservation]
            self.stores[which].settle_paid(reservation, usd * share)
            self.own[which][reservation] = (client, usd * share)
            if reservation in self.rows:
                self.rows[reservation] = (client, usd * share)

    @rule(data=st.data())
    def operator_deletes_a_row(self, data: st.DataObject) -> None:
        if self.rows:
            reservation = data.draw(st.sampled_from(sorted(self.rows)))
            with contextlib.closing(sqlite3.connect(self.path)) as db, db:
                db.execute("DELETE FROM paid_ledger WHERE id = ?", (reservation,))
            del self.rows[reservation]

    @rule(how=st.sampled_from(["fresh", "copy", "older"]))
    def replace_the_file(self, how: str) -> None:
        new = self.folder / "new.db"
        if how == "copy":
            with (
                contextlib.closing(sqlite3.connect(self.path)) as db,
                contextlib.closing(sqlite3.connect(new)) as copy,
            ):
                db.backup(copy)
        elif how == "older":
            _old_file(new, [("old", DAY, 0.1, None)])
            self.rows = {"old": (None, 0.1)}
        else:
            SQLiteStore(str(new)).close()
            self.rows = {}
        _delete(self.path)
        os.replace(new, self.path)
        for store, own in zip(self.stores, self.own, strict=True):
            assert store.begin_sync(NOW)
            store.reseed(_view(), NOW)
            self.rows = {**own, **self.rows}  # a row the file has already is kept as it is

    @invariant()
    def totals_are_the_rows(self) -> None:
        exact = _totals_match_rows(self.path)
        assert sum(exact.values()) == sum(Fraction(usd) for _, usd in self.rows.values())
        for store in self.stores:
            assert math.isclose(
                store.paid_spent(DAY), math.fsum(u for _, u in self.rows.values()), abs_tol=1e-12
            )
            for client in ("", "ci", "web"):
                mine = math.fsum(u for c, u in self.rows.values() if c == client)
                assert math.isclose(store.paid_spent(DAY, client), mine, abs_tol=1e-12)

    def teardown(self) -> None:
        for store in self.stores:
            store.close()


def test_the_totals_equal_the_rows_through_any_sequence(tmp_path):
    """Random reservations, settlements, deletions and file replacements with reseeds: the
    running totals equal the rows' sums (exactly, to a few ulps), per day and client."""
    run_state_machine_as_test(
        lambda: Totals(tmp_path),  # type: ignore[arg-type]  # a factory: Hypothesis calls it
        settings=settings(max_examples=examples(40), stateful_step_count=30, deadline=None),
    )

"""The SQLite state file: a concurrent first open is safe; a file deleted or replaced under a
running process is noticed, closes paid, and is reopened with this process's view written
back."""

from __future__ import annotations

import multiprocessing
import os
import traceback
from pathlib import Path

import pytest

import lanes
from helpers import config, paid_lane, store_up
from lanes._core.freetier.backoff import Backoff
from lanes._core.state.store import LocalView, SQLiteStore, StoreUnavailable
from lanes.testing import open_fake

DAY = 20_000
NOW = DAY * 86400.0 + 3600.0


def _open_and_write(path: str, barrier, results) -> None:
    try:
        barrier.wait(timeout=30)
        store = SQLiteStore(path)
        store.put_switch("lane-a", True, 1.0)
        reservation = store.reserve_paid(
            day=DAY, amount=0.01, ceiling=10.0, lane="p", model="m", job="j", cohort=None
        )
        assert reservation is not None
        store.close()
        results.put("")
    except BaseException:
        results.put(traceback.format_exc())


def test_eight_processes_create_one_new_file_at_once(tmp_path):
    """Eight processes opening one new state file at the same instant, twenty times: every one
    opens it, writes to it, and the eight reservations are all there."""
    context = multiprocessing.get_context("fork")
    for round_ in range(20):
        path = str(tmp_path / f"round-{round_}" / "state.db")
        barrier, results = context.Barrier(8), context.Queue()
        processes = [
            context.Process(target=_open_and_write, args=(path, barrier, results)) for _ in range(8)
        ]
        for process in processes:
            process.start()
        failures = [failure for failure in (results.get(timeout=60) for _ in processes) if failure]
        for process in processes:
            process.join(timeout=30)
        assert not failures, f"round {round_}: {failures[0]}"
        assert [p.exitcode for p in processes] == [0] * 8
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
    return store.reserve_paid(
        day=DAY, amount=amount, ceiling=1.0, lane="p", model="m", job="j", cohort=None
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

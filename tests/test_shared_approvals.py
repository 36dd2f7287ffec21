"""Pending approvals in the state store: listed by every process (or host) sharing it, decided once
by whichever decides first — the same contract for the SQLite file and for Redis."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from lanes._core.state.store import ApprovalRecord, SQLiteStore, Store

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
def two(request: pytest.FixtureRequest, tmp_path) -> Iterator[tuple[Store, Store]]:
    """Two stores on one state: two processes on one SQLite file, or two hosts on one Redis."""
    make: Callable[[], Store]
    if request.param == "sqlite":

        def make() -> Store:
            return SQLiteStore(str(tmp_path / "state.db"))

    else:
        from lanes._core.state.redis_store import RedisStore

        server = request.getfixturevalue("redis_server")

        def make() -> Store:
            store = RedisStore(server.url, local=SQLiteStore(":memory:"))
            store.begin_sync(NOW)
            store.flush()
            return store

    a, b = make(), make()
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

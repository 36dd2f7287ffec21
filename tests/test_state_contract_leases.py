"""The probe lease's contract (`ProbeLeases`), on both backends: one process of the host (one host
of the fleet) probes a closed door; its release carries the backoff the probe caused, written
first; a store never waits on its own lease, and a late release never frees a newer lease.

A release reaches the store at the next flush (Redis queues it; SQLite writes it at once), so each
test flushes where the sync would."""

from __future__ import annotations

import time

import pytest
from state_backends import BACKENDS, open_state

from lanes._core.freetier.backoff import Backoff

TTL_S = 30.0  # no lease here lapses within a test: expiry is each backend's own test


@pytest.fixture(params=BACKENDS)
def state(request, tmp_path):
    with open_state(request, tmp_path) as state:
        yield state


def closed(until: float) -> Backoff:
    return Backoff(until=until, step=1, reason="rate_limited", source="retry-after")


def test_one_store_probes_and_its_release_carries_the_backoff(state):
    """Two stores: one takes the lease, the other is refused; the release writes the backoff
    first, so the other then sees the door closed rather than a free lease."""
    a, b = state.pair()
    now = time.time()
    assert a.probe_lease("free/m", TTL_S, now) is True
    assert b.probe_lease("free/m", TTL_S, now) is False
    a.probe_done("free/m", ok=False, backoff=closed(now + 20))
    a.flush()
    seen = b.probe_lease("free/m", TTL_S, now + 1)
    assert isinstance(seen, Backoff) and seen.until == pytest.approx(now + 20)
    assert dict(b.backoffs(now + 1))["free/m"].until == pytest.approx(now + 20)


def test_a_release_without_a_backoff_frees_the_lease_for_the_others(state):
    """A probe that answered releases its lease: another store may take it at once."""
    a, b = state.pair()
    now = time.time()
    assert a.probe_lease("free/m", TTL_S, now) is True
    a.probe_done("free/m", ok=True)
    a.flush()
    assert b.probe_lease("free/m", TTL_S, now) is True
    assert a.probe_lease("free/m", TTL_S, now) is False


def test_a_store_takes_over_its_own_lease_and_its_old_release_leaves_it(state):
    """A store whose probe finished (its release not yet written) may probe again at once —
    never waiting on its own lease — while the others still may not; the old release does not
    free the new lease; the new one's does."""
    a, b = state.pair()
    now = time.time()
    assert a.probe_lease("free/m", TTL_S, now) is True
    assert a.probe_lease("free/m", TTL_S, now) is True  # its own: taken over, under a new token
    assert b.probe_lease("free/m", TTL_S, now) is False
    a.probe_done("free/m", ok=False)
    a.flush()
    assert b.probe_lease("free/m", TTL_S, now) is True


def test_a_release_of_a_scope_not_leased_changes_nothing(state):
    """Releasing what this store does not hold is a no-op: the holder keeps its lease."""
    a, b = state.pair()
    now = time.time()
    assert a.probe_lease("free/m", TTL_S, now) is True
    b.probe_done("free/m", ok=False, backoff=closed(now + 20))
    b.flush()
    assert b.probe_lease("free/m", TTL_S, now) is False
    assert b.backoffs(now) == []

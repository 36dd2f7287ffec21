"""The grants' contract (`Grants`), on both backends: a client granted paid fallback by one process
(host) is granted for every other from its next sync, until the grant's end; the write made last
wins, so a revocation sticks."""

from __future__ import annotations

import time

import pytest
from state_backends import BACKENDS, open_state, sync


@pytest.fixture(params=BACKENDS)
def state(request, tmp_path):
    with open_state(request, tmp_path) as state:
        yield state


def test_a_grant_is_seen_by_every_store_until_it_ends(state):
    """Granted on one store: the other knows its end, and lists it only while in force."""
    a, b = state.pair()
    now = time.time()
    a.put_grant("ci", now + 3600, now)
    sync(a, b)
    assert b.grant_until("ci") == pytest.approx(now + 3600)
    assert b.grants(now) == {"ci": pytest.approx(now + 3600)}
    assert b.grants(now + 3601) == {}
    assert b.grant_until("nightly") is None


def test_a_revocation_sticks(state):
    """A past `until`, written last, revokes the grant on every store."""
    a, b = state.pair()
    now = time.time()
    a.put_grant("ci", now + 3600, now)
    sync(a, b)
    b.put_grant("ci", now - 1, now + 1)
    sync(a, b)
    assert a.grants(now + 2) == {} and b.grants(now + 2) == {}
    assert a.grant_until("ci") == pytest.approx(now - 1)

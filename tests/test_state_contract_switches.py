"""The kill switch's and the quarantine's contract (`Switches`), on both backends: a lane switched
off by one process (host) is off for every other from its next sync, the last write wins, the
canary's quarantine is shared with its reason, and both come back after the state lost them."""

from __future__ import annotations

import time

import attrs
import pytest
from state_backends import BACKENDS, EMPTY_VIEW, open_state, resync, sync

from lanes._core.state.store import LocalView


@pytest.fixture(params=BACKENDS)
def state(request, tmp_path):
    with open_state(request, tmp_path) as state:
        yield state


def test_a_switch_is_obeyed_by_every_store_and_the_last_write_wins(state):
    """Off on one store: off on the other after the sync; on again: on everywhere."""
    a, b = state.pair()
    now = time.time()
    a.put_switch("free", True, now)
    a.put_switch("paid", True, now)
    sync(a, b)
    assert b.switches() == {"free", "paid"}
    b.put_switch("free", False, now + 1)
    sync(a, b)
    assert a.switches() == {"paid"}


def test_the_quarantine_is_shared_with_its_verdict_and_reason_until_released(state):
    """A candidate quarantined by one store is quarantined, with the verdict and reason, for the
    other; released, it is gone for both."""
    a, b = state.pair()
    a.set_quarantine("free/m", "drifted", "3 of 10 answers moved", at=1.0)
    assert b.quarantined() == {
        "free/m": "quarantined by the canary (drifted: 3 of 10 answers moved)"
    }
    b.set_quarantine("free/m", None)
    assert a.quarantined() == {}


def test_a_lost_state_gets_the_switches_back(state):
    """After a loss, a store's view puts its switched-off lanes back (without switching on what
    another put back)."""
    a, b = state.pair()
    state.forget()
    assert resync(a, attrs.evolve(EMPTY_VIEW, switched_off=frozenset({"free"})))
    assert resync(b, attrs.evolve(EMPTY_VIEW, switched_off=frozenset({"paid"})))
    sync(a, b)
    assert a.switches() == b.switches() == {"free", "paid"}


def test_a_view_without_switches_switches_nothing_on(state):
    """A reseed from a store that knew of no switch leaves the state's switches alone."""
    a, b = state.pair()
    a.put_switch("free", True, time.time())
    sync(a, b)
    b.reseed(LocalView(**attrs.asdict(EMPTY_VIEW, recurse=False)), time.time())
    sync(a, b)
    assert b.switches() == {"free"}

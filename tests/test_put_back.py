"""After a loss, paid waits for every host live before to put its reservations back
(`lanes/_core/state/put_back.py`): the rule on its own, searched by Hypothesis. The same rule on a
real redis-server is tests/test_redis_store.py's."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import examples
from lanes._core.state.put_back import PutBack
from lanes._core.state.terms import LIVE_S

HOSTS = st.sampled_from(["a", "b", "c", "d"])


@settings(max_examples=examples(200))
@given(
    peers=st.frozensets(HOSTS),
    rounds=st.lists(st.tuples(st.frozensets(HOSTS | st.just("me")), st.floats(0, 2 * LIVE_S))),
)
def test_paid_reopens_only_when_every_awaited_host_is_back_or_gone(peers, rounds):
    """Paid stays closed until this host put its own back and every peer live before the loss
    either did too or was silent for `LIVE_S`; it never gives up on itself."""
    wait = PutBack(own="me")
    wait.lost("lost", peers, 100.0)
    heard: set[str] = set()
    clock = 100.0
    for restored, step in rounds:
        clock += step
        was = wait.waiting
        gone, _ = wait.heard(set(restored), clock)
        heard |= restored
        assert "me" not in gone
        if was:
            late = clock - 100.0 >= LIVE_S
            expected_open = "me" in heard and (late or peers <= heard)
            assert wait.waiting is not expected_open
            assert set(gone) <= peers - heard
        if wait.waiting:
            assert wait.why_closed("r") and wait.awaited <= (peers | {"me"}) - heard


def test_one_line_per_loss_and_its_reopening_follows_it():
    """The closing is said once per loss; the reopening is reported only when the closing was."""
    wait = PutBack(own="me")
    wait.lost("lost", frozenset({"b"}), 0.0)
    said = wait.to_say("r")
    assert "(waiting for: this host, b;" in said and wait.to_say("r") == ""
    assert wait.heard({"me"}, 1.0) == ([], False)
    assert wait.heard({"b"}, 2.0) == ([], True)
    assert not wait.waiting and wait.why_closed("r") == ""
    wait.lost("again", frozenset({"b"}), 3.0)  # a second loss: said again
    assert wait.heard({"me"}, 3.0 + LIVE_S) == (["b"], False)  # gone; never said, never reopened
    assert not wait.waiting


def test_a_host_that_met_an_empty_redis_holding_its_own_waits_out_the_hold():
    """Hosts it can not name (restarted with Redis) get `hold_s` to come back: paid stays closed
    that long even when every host it knows has put its own back."""
    wait = PutBack(own="me")
    wait.lost("met empty", frozenset(), 10.0, hold_s=LIVE_S)
    assert f"any host it can not name, {LIVE_S:.0f} s" in wait.why_closed("r")
    assert wait.heard({"me"}, 11.0) == ([], False) and wait.waiting
    assert wait.heard(set(), 10.0 + LIVE_S) == ([], False) and not wait.waiting


def test_a_silent_host_is_waited_for_as_long_as_its_reservations_may_be_billed():
    """On Redis a loss's patience runs to the end of the UTC day (a silent host's reservations
    may come back until then): past `LIVE_S` paid is still closed; at the day's end the silent
    host is given up on and named."""
    wait = PutBack(own="me")
    wait.lost("lost", frozenset({"b"}), 0.0, patience_s=5000.0)
    assert "until it starts again, or the UTC day ends" in wait.why_closed("r")
    assert wait.heard({"me"}, LIVE_S + 1) == ([], False) and wait.waiting
    assert wait.heard(set(), 5000.0) == (["b"], False) and not wait.waiting

"""The free tier's memory's contract (`FreeTierMemory`), on both backends: counts and spend add up
across processes (hosts), a backoff keeps the later deadline and is never reported past it, a
header snapshot written by one is read by the others, and a state that lost its data gets the
larger counts back."""

from __future__ import annotations

import time

import attrs
import pytest
from state_backends import BACKENDS, EMPTY_VIEW, open_state, resync

from lanes._core.freetier.backoff import Backoff, Reason
from lanes._core.freetier.headers import RateLimitSnapshot, Window
from lanes._core.freetier.windows import end_of, window_id
from lanes._core.state.store import LocalView

FIELDS = attrs.asdict(EMPTY_VIEW, recurse=False)


@pytest.fixture(params=BACKENDS)
def state(request, tmp_path):
    with open_state(request, tmp_path) as state:
        yield state


def backoff(until: float, reason: Reason = "rate_limited") -> Backoff:
    return Backoff(until=until, step=1, reason=reason, source="retry-after")


def test_a_backoff_race_keeps_the_later_deadline_and_ends_at_it(state):
    """Two writers racing on one scope: the later deadline wins, whoever writes last; a backoff
    past its deadline is not reported."""
    a, b = state.pair()
    now = time.time()
    a.put_backoffs({"groq/*": backoff(now + 30)}, now)
    b.put_backoffs({"groq/*": backoff(now + 10)}, now)  # the earlier one loses
    b.put_backoffs({"groq/m": backoff(now + 5)}, now)
    a.put_backoffs({"groq/m": backoff(now + 8)}, now)
    seen = dict(b.backoffs(now))
    assert seen["groq/*"].until == pytest.approx(now + 30)
    assert seen["groq/m"].until == pytest.approx(now + 8)
    assert dict(a.backoffs(now + 9)).keys() == {"groq/*"}


def test_usage_and_spend_add_up_across_stores_and_a_new_window_starts_empty(state):
    """Counts and credit spend from two writers add up; the next day's window reads zero."""
    a, b = state.pair()
    now = time.time()
    day, minute = window_id("day", now), window_id("minute", now)
    a.add_usage(
        [(("groq/*", "requests", "day", day), 3), (("groq/*", "requests", "minute", minute), 3)],
        {("openrouter", day): 0.5},
    )
    b.add_usage([(("groq/*", "requests", "day", day), 4)], {("openrouter", day): 0.25})
    totals = dict(a.usage_totals(now))
    assert totals[("groq/*", "requests", "day", day)] == 7
    assert totals[("groq/*", "requests", "minute", minute)] == 3
    assert b.spend_totals() == {("openrouter", day): 0.75}
    assert a.usage_totals(end_of("day", day) + 1) == []


def test_a_store_that_never_called_a_provider_knows_its_last_headers(state):
    """A header snapshot written by one is read by another, whole."""
    a, b = state.pair()
    window = Window(dimension="requests", window_s=60.0, limit=30, remaining=2, reset_s=12.0)
    snapshot = RateLimitSnapshot(
        requests_remaining=2,
        requests_limit=30,
        tokens_remaining=None,
        tokens_limit=None,
        reset_requests_s=12.0,
        reset_tokens_s=None,
        retry_after_s=None,
        windows=(window,),
    )
    a.put_snapshots({"groq/*": (123.0, snapshot)})
    at, seen = b.snapshots()["groq/*"]
    assert (at, seen.requests_remaining, seen.windows) == (123.0, 2, (window,))


def test_a_lost_state_gets_the_larger_counts_and_the_live_backoffs_back(state):
    """After a loss each store writes its view back: per counter the larger count wins (never
    their sum), spend likewise, and only the backoffs still in force come back."""
    a, b = state.pair()
    now = time.time()
    day = window_id("day", now)
    state.forget()
    counted = [(("g/*", "requests", "day", day), 9)]
    assert resync(b, LocalView(**{**FIELDS, "usage": counted, "spend": {("or", day): 0.7}}), now)
    view = LocalView(
        usage=[(("g/*", "requests", "day", day), 5), (("h/*", "requests", "day", day), 2)],
        spend={("or", day): 0.5},
        backoffs={"g/*": backoff(now + 60), "h/*": backoff(now - 1)},
        snapshots={},
        switched_off=frozenset(),
    )
    assert resync(a, view, now)
    totals = dict(b.usage_totals(now))
    assert totals[("g/*", "requests", "day", day)] == 9
    assert totals[("h/*", "requests", "day", day)] == 2
    assert a.spend_totals()[("or", day)] == pytest.approx(0.7)
    assert [scope for scope, _ in b.backoffs(now)] == ["g/*"]

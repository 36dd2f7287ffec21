"""The breaker as a pure state machine: exact transitions at exact times."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from lanes._core.policy.breaker import Breaker, BreakerPolicy, Permit


def breaker(**kw) -> Breaker:
    return Breaker(BreakerPolicy(**{"jitter": 0.0, **kw}), random=lambda: 0.5)


def must_acquire(b: Breaker, now: float) -> Permit:
    """A permit the test expects to be granted (the breaker is closed, or half-open and free)."""
    granted = b.acquire(now)
    assert granted is not None, f"no permit at t={now}: {b.statistics(now)}"
    return granted


def reopen_at(b: Breaker, now: float) -> float:
    """When an open breaker lets a probe through (None only while closed)."""
    at = b.statistics(now).reopen_at
    assert at is not None, f"breaker is closed at t={now}"
    return at


def fault(b: Breaker, now: float) -> None:
    b.count(must_acquire(b, now), "fault", now)


def test_opens_after_consecutive_faults():
    """N consecutive faults open it; a success in between resets the count."""
    b = breaker(failures=3)
    fault(b, 0)
    fault(b, 1)
    b.count(must_acquire(b, 2), "success", 2)
    fault(b, 3)
    fault(b, 4)
    assert b.state(4) == "closed"
    fault(b, 5)
    assert b.state(5) == "open" and b.acquire(5) is None


def test_opens_on_failure_ratio_over_window():
    """Alternating faults never make 3 in a row, but a 50 % ratio over 10 calls opens it."""
    b = breaker(failures=3, ratio=0.5, min_calls=10, window_s=60)
    for i in range(9):
        b.count(must_acquire(b, i), "fault" if i % 2 else "success", i)
    assert b.state(9) == "closed"
    b.count(must_acquire(b, 9), "fault", 9)
    assert b.state(9) == "open"


def test_old_calls_leave_the_window():
    """Faults older than the window do not count toward the ratio."""
    b = breaker(failures=100, ratio=0.5, min_calls=4, window_s=10)
    for t in (0, 1):
        fault(b, t)
    for t in (20, 21, 22):
        b.count(must_acquire(b, t), "success", t)
    fault(b, 23)
    assert b.state(23) == "closed"


def test_half_open_allows_exactly_one_probe():
    """After the cooldown one probe is granted; others wait until it settles."""
    b = breaker(failures=1, cooldown_s=10)
    fault(b, 0)
    assert b.acquire(9.999) is None
    probe = b.acquire(10)
    assert probe is not None and probe.probe
    assert b.acquire(10) is None
    b.count(probe, "success", 11)
    assert b.state(11) == "closed" and must_acquire(b, 11).probe is False


def test_failed_probe_reopens_with_a_longer_cooldown_capped():
    """Each reopening doubles the cooldown, up to the cap."""
    b = breaker(failures=1, cooldown_s=10, growth=2, cooldown_max_s=35)
    fault(b, 0)
    reopen = [reopen_at(b, 0)]
    now = reopen[-1]
    for _ in range(3):
        probe = must_acquire(b, now)
        b.count(probe, "fault", now)
        reopen.append(reopen_at(b, now))
        now = reopen[-1]
    gaps = [b - a for a, b in zip(reopen, reopen[1:], strict=False)]
    assert reopen[0] == 10 and gaps == [20, 35, 35]


def test_released_probe_frees_the_slot():
    """A probe cancelled by our own deadline is released: the next caller may probe at once."""
    b = breaker(failures=1, cooldown_s=5)
    fault(b, 0)
    probe = must_acquire(b, 5)
    b.release(probe)
    stats = b.statistics(5)
    assert stats.state == "half_open" and not stats.probe_in_flight
    assert b.acquire(5) is not None


def test_neutral_verdicts_count_nothing():
    """429/402 verdicts neither open nor close the breaker."""
    b = breaker(failures=2)
    for t in range(10):
        b.count(must_acquire(b, t), "neutral", t)
    assert b.statistics(10).window_calls == 0 and b.state(10) == "closed"


def test_jitter_only_lengthens_the_cooldown():
    """The jitter draws from the injected source and adds at most `jitter` of the cooldown."""
    b = Breaker(BreakerPolicy(failures=1, cooldown_s=10, jitter=0.2), random=lambda: 0.999)
    fault(b, 0)
    assert 10 < reopen_at(b, 0) < 12


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["success", "fault", "neutral", "release"]),
            st.floats(min_value=0, max_value=5),
        ),
        max_size=60,
    )
)
def test_never_more_than_one_probe_and_never_stuck(events):
    """Whatever happens, at most one probe is out, and an open breaker always reopens in time."""
    b = breaker(failures=2, cooldown_s=3, cooldown_max_s=20)
    now, out = 0.0, []
    for verdict, step in events:
        now += step
        permit = b.acquire(now)
        if permit is not None:
            out.append(permit)
        assert sum(1 for p in out if p.probe) <= 1
        if out:
            p = out.pop(0)
            if verdict == "release":
                b.release(p)
            else:
                b.count(p, verdict, now)
    stats = b.statistics(now)
    if stats.state == "open":
        assert stats.reopen_at is not None
        assert stats.reopen_at <= now + 20 * 1.0 + 1e-9
        assert b.acquire(stats.reopen_at) is not None

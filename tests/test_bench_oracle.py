"""The free-share oracle: an exact max-flow, so an upper bound on what any assignment can serve."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from bench.freeshare import PROVIDERS, arrivals, oracle
from helpers import examples


def greedy(times: list[float]) -> int:
    """A feasible assignment (serve with the first provider that has room): a lower bound."""
    used: dict[tuple[int, int], int] = {}
    day_used = [0] * len(PROVIDERS)
    served = 0
    for t in sorted(times):
        minute = int(t // 60)
        for i, (_, rpm, rpd, _, _) in enumerate(PROVIDERS):
            if used.get((i, minute), 0) < rpm and day_used[i] < rpd:
                used[(i, minute)] = used.get((i, minute), 0) + 1
                day_used[i] += 1
                served += 1
                break
    return served


def test_small_cases_by_hand():
    """Under every quota everything is served; a burst is capped by the sum of per-minute quotas."""
    total_rpm = sum(p[1] for p in PROVIDERS)
    assert oracle([1.0, 2.0, 3.0]) == 3
    assert oracle([0.5] * (total_rpm + 40)) == total_rpm


@settings(max_examples=examples(60))
@given(st.lists(st.floats(0, 3 * 3600, allow_nan=False), max_size=400))
def test_oracle_bounds_any_feasible_assignment(times):
    """No feasible assignment serves more than the oracle, and it never exceeds the job count."""
    assert greedy(times) <= oracle(times) <= len(times)


def test_arrivals_are_reproducible():
    assert arrivals(1.0) == arrivals(1.0) and len(arrivals(2.0)) > len(arrivals(1.0))

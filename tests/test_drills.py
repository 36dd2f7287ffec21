"""Every drill is also a test: it must pass, and say what it measured."""

from __future__ import annotations

import pytest

from lanes.drills.scenarios import DRILLS

ABOUT_THE_FREE_LANE = {"rate-limit-storm", "credits-gone", "quality-drift", "crash"}
# The drills that start `lanes serve` processes (or redis-server): slow.
STARTS_PROCESSES = {
    "free-off",
    "lane-deleted",
    "provider-refused-at-start",
    "provider-hung",
    "crash",
    "shared-state-lost",
    "redis-evict",
    "redis-failover",
    "batch-crash",
    "clock-step",
    "client-gone",
    "h2-flood",
    "hostile-upstream",
    "worker-restart",
}


def marks(name: str) -> list[pytest.MarkDecorator]:
    """free_lane for a drill about the free lane itself, slow for one that starts processes."""
    found = []
    if name in ABOUT_THE_FREE_LANE:
        found.append(pytest.mark.free_lane)
    if name in STARTS_PROCESSES:
        found.append(pytest.mark.slow)
    return found


@pytest.mark.parametrize("name", [pytest.param(n, marks=marks(n)) for n in DRILLS])
async def test_drill(name, tmp_path):
    """The drill passes and reports a figure."""
    result = await DRILLS[name](tmp_path)
    assert result.ok, f"{result.figure} {result.detail}"
    assert result.figure

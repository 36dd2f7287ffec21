"""Every drill is also a test: it must pass, and say what it measured."""

from __future__ import annotations

import pytest

from lanes.drills.scenarios import DRILLS

ABOUT_THE_FREE_LANE = {"rate-limit-storm", "credits-gone", "quality-drift", "crash"}


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.free_lane) if n in ABOUT_THE_FREE_LANE else n
        for n in DRILLS
    ],
)
async def test_drill(name, tmp_path):
    """The drill passes and reports a figure."""
    result = await DRILLS[name](tmp_path)
    assert result.ok, f"{result.figure} {result.detail}"
    assert result.figure

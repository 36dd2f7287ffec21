"""The two clocks `lanes` reads, as distinct types, so that a time on one is never taken for a time
on the other. Durations (`*_s`) are plain floats: the difference of two times on one clock.

- `TrioTime`: seconds on trio's clock (`trio.current_time()`): monotonic, and virtual under
  `autojump_clock` in tests. Every deadline and every breaker cooldown is on it.
- `EpochTime`: wall-clock seconds since the Unix epoch, read from the wall source (`wall.py`) at
  every decision.
  Quota windows (UTC minute, day, month), provider resets and backoff deadlines are on it, since
  providers speak in dates and other processes share them.
"""

from __future__ import annotations

from typing import NewType

# lanes: pure

TrioTime = NewType("TrioTime", float)
EpochTime = NewType("EpochTime", float)


def disagreement(skew_s: float, tolerance_s: float, source: str) -> str:
    """Why a process whose wall is `skew_s` behind `source`'s clock (negative: ahead) may not pay,
    or "" when they agree within `tolerance_s`."""
    if abs(skew_s) <= tolerance_s:
        return ""
    side = "ahead of" if skew_s < 0 else "behind"
    return (
        f"this process's wall clock is {abs(skew_s):.1f}s {side} {source} (tolerance "
        f"{tolerance_s:g}s): paid fallback is closed until they agree"
    )

"""The two clocks `lanes` reads, as distinct types, so that a time on one is never taken for a time
on the other. Durations (`*_s`) are plain floats: the difference of two times on one clock.

- `TrioTime`: seconds on trio's clock (`trio.current_time()`): monotonic, and virtual under
  `autojump_clock` in tests. Every deadline and every breaker cooldown is on it.
- `EpochTime`: wall-clock seconds since the Unix epoch, derived from trio's clock once (at open).
  Quota windows (UTC minute, day, month), provider resets and backoff deadlines are on it, since
  providers speak in dates and other processes share them.
"""

from __future__ import annotations

from typing import NewType

# lanes: pure

TrioTime = NewType("TrioTime", float)
EpochTime = NewType("EpochTime", float)

"""Client-side usage counting per window: minute, day and month, with UTC boundaries. Pure.

Times are wall-clock epoch seconds (quota windows are calendar facts: a day ends at UTC midnight).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Literal

WindowName = Literal["minute", "day", "month"]
WINDOWS: tuple[WindowName, ...] = ("minute", "day", "month")


def window_id(window: WindowName, now: float) -> int:
    """The index of the window containing `now` (minutes and days since the epoch; months as
    y*12+m)."""
    if window == "minute":
        return int(now // 60)
    if window == "day":
        return int(now // 86400)
    return _month_of_day(int(now // 86400))


@functools.lru_cache(maxsize=64)
def _month_of_day(day: int) -> int:
    """The month (y*12+m) of UTC day number `day`: months begin at UTC midnight, so one day
    lies in one month (computed once per day, not once per count)."""
    moment = datetime.fromtimestamp(day * 86400, tz=UTC)
    return moment.year * 12 + moment.month - 1


def window_end(window: WindowName, now: float) -> float:
    """When the window containing `now` ends (epoch seconds)."""
    return end_of(window, window_id(window, now))


def end_of(window: WindowName, index: int) -> float:
    """When window number `index` (as `window_id` counts them) ends (epoch seconds)."""
    if window == "minute":
        return (index + 1) * 60.0
    if window == "day":
        return (index + 1) * 86400.0
    index += 1
    return datetime(index // 12, index % 12 + 1, 1, tzinfo=UTC).timestamp()


Key = tuple[str, str, WindowName, int]  # (scope, dimension, window, window id)


class UsageCounter:
    """Requests and tokens per scope (a `lane/model` or `lane/*`) and window; old windows
    dropped."""

    def __init__(self) -> None:
        self.counts: dict[Key, int] = {}

    def add(
        self, scope: str, now: float, *, requests: int = 0, tokens: int = 0
    ) -> list[tuple[Key, int]]:
        """Count usage at `now`; return the (key, delta) pairs written, for persistence."""
        written = []
        for dimension, amount in (("requests", requests), ("tokens", tokens)):
            if not amount:
                continue
            for window in WINDOWS:
                key = (scope, dimension, window, window_id(window, now))
                self.counts[key] = self.counts.get(key, 0) + amount
                written.append((key, amount))
        return written

    def used(self, scope: str, dimension: str, window: WindowName, now: float) -> int:
        return self.counts.get((scope, dimension, window, window_id(window, now)), 0)

    def merge(self, rows: Iterable[tuple[Key, int]]) -> None:
        """Take totals read from the shared store (they include other processes' usage)."""
        for key, total in rows:
            if total > self.counts.get(key, 0):
                self.counts[key] = total

    def prune(self, now: float) -> None:
        current = {window: window_id(window, now) for window in WINDOWS}
        self.counts = {k: v for k, v in self.counts.items() if k[3] >= current[k[2]]}

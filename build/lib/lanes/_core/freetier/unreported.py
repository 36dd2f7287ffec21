"""What is left of a window a provider reported, now: its figure less what was sent since. Pure.

A provider's `remaining` is true when it answered, of the requests it had taken by then. Answers
to requests sent together arrive in any order, each with the figure of its own moment: within one
window the lowest figure is the latest (`combined` keeps it), and it has every request whose answer
said more. The others may not be in it: `Unreported` keeps each send, with the tokens it may use,
until its own answer reports on it — those still in flight, and those answered without rate-limit
headers, count against the window they were sent in until it ends.

At the window's reset the reported figure does not vanish: the window starts again at its limit,
for `window_s` (when the provider did not say, a minute, or what was left of it when longer), and
the sends since count against it.

Times are wall-clock epoch seconds, as the manager's.
"""

from __future__ import annotations

import bisect
import math

import attrs

from lanes._core.freetier.headers import RateLimitSnapshot, Window

DEFAULT_RESET_S = 60.0  # a reset the provider did not give counts as a minute
SAME_RESET_S = 1.0  # two resets this close are one window's (providers round them to the second)

Send = tuple[int, float, int, int]  # (number, at, requests, tokens)


def _reset_at(at: float, window: Window) -> float:
    return at + (window.reset_s or DEFAULT_RESET_S)


def _length(at: float, window: Window) -> float:
    """The window's length: as the provider said, else a minute, or what was left of it if
    longer."""
    return window.window_s or max(DEFAULT_RESET_S, _reset_at(at, window) - at)


def period_now(at: float, window: Window, now: float) -> tuple[float, float, float] | None:
    """The period of `window` (reported at `at`) that holds `now`: (its start, its end, what was
    left of it) — the reported figure until the reported reset, the limit in the periods after.
    None when the report gave no limit or no remaining figure."""
    if window.limit is None or window.remaining is None:
        return None
    reset_at, length = _reset_at(at, window), _length(at, window)
    if now < reset_at:
        return reset_at - length, reset_at, window.remaining
    start = reset_at + math.floor((now - reset_at) / length) * length
    if start + length <= now:  # rounding, at a boundary
        start += length
    return start, start + length, window.limit


def combined(
    kept: tuple[float, RateLimitSnapshot] | None, at: float, report: RateLimitSnapshot
) -> RateLimitSnapshot:
    """`report` (made at `at`) as the manager keeps it beside what it `kept` of the same scope:
    each window that resets when the kept one does (still running) has the lower of the two
    figures; an answer that resets sooner is of a window already over, and the kept one stays."""
    if kept is None:
        return report
    before, old = kept
    running = {
        (w.dimension, w.window_s): w
        for w in old.windows
        if w.remaining is not None and _reset_at(before, w) > at
    }
    windows = []
    for w in report.windows:
        same = running.get((w.dimension, w.window_s))
        if same is None or w.remaining is None:
            windows.append(w)
            continue
        gap = _reset_at(at, w) - _reset_at(before, same)
        if gap < -SAME_RESET_S:  # the answer's window ended: the running one stays
            windows.append(attrs.evolve(same, reset_s=_reset_at(before, same) - at))
        elif gap <= SAME_RESET_S and same.remaining is not None and same.remaining < w.remaining:
            windows.append(attrs.evolve(w, remaining=same.remaining))
        else:
            windows.append(w)
    return attrs.evolve(report, windows=tuple(windows))


class Unreported:
    """The sends on each scope whose own answer has not reported on them, in the order sent."""

    def __init__(self) -> None:
        self._sends: dict[str, list[Send]] = {}
        self._last = 0

    def add(self, scope: str, at: float, *, requests: int, tokens: int, keep_from: float) -> int:
        """`requests` sent at `at` that may use `tokens`; its number (for `reported`). Sends
        before `keep_from` (no window counts them any more) are let go."""
        sends = self._sends.setdefault(scope, [])
        del sends[: bisect.bisect_left(sends, keep_from, key=lambda s: s[1])]
        self._last += 1
        # in the order sent, should the wall step back
        sends.append((self._last, max(at, sends[-1][1]) if sends else at, requests, tokens))
        return self._last

    def reported(self, scope: str, number: int) -> None:
        """The answer to send `number` on `scope` reported on it."""
        sends = self._sends.get(scope)
        if sends is not None:
            self._sends[scope] = [send for send in sends if send[0] != number]

    def since(self, scope: str, dimension: str, start: float) -> int:
        """How much of `dimension` (requests, or tokens for the `tokens` dimension; 0 for the
        others) sent on `scope` at or after `start` no answer has reported on."""
        if dimension not in ("requests", "tokens"):
            return 0
        sends = self._sends.get(scope, [])
        first = bisect.bisect_left(sends, start, key=lambda s: s[1])
        tokens = dimension == "tokens"
        return sum(
            sent_tokens if tokens else requests for _, _, requests, sent_tokens in sends[first:]
        )

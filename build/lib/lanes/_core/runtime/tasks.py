"""The health of the background tasks — the state sync and its listener, catalog refreshes, balance
polls — which must never die and never fail silently.

Each task catches everything but cancellation around each round of its work and reports here:
`failed(exc)` logs one line per *distinct* failure (digits aside, so a message carrying a changing
number is one failure) while the failure lasts, and `ok()` ends it with one line. What a task drops
instead of retrying for ever — a poison record, rows over a queue's bound — is counted by
`dropped(queue, n)`. `/ready`, `/metrics` and the page read it through `Dispatcher.statistics()`.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Mapping

import attrs
import trio

from lanes._core.runtime.secrets import redact_log

log = logging.getLogger("lanes")
_DIGITS = re.compile(r"\d+")
SYNC = "state sync"  # the names of the tasks every dispatcher runs
LISTENER = "state listener"
MAX_DISTINCT = 32  # distinct failures remembered per streak (beyond: no more lines, still counted)


@attrs.frozen(kw_only=True)
class TaskStatistics:
    name: str
    failing: str | None  # the last failure while the task is failing, None when it is working
    failing_for_s: float  # how long it has been failing (0 when it is not)
    failures: int  # failed rounds since the process started


@attrs.frozen(kw_only=True)
class BackgroundStatistics:
    tasks: tuple[TaskStatistics, ...]
    dropped: Mapping[str, int]  # queue → records dropped (poison, or over the queue's bound)

    @property
    def failing(self) -> dict[str, str]:
        """Task → its last failure, for the tasks failing now."""
        return {t.name: t.failing for t in self.tasks if t.failing is not None}


class TaskHealth:
    """One background task's failures. Build it with `Background.task(name)`."""

    def __init__(self, name: str, dropped: Counter[str]) -> None:
        self.name = name
        self.failing: str | None = None
        self.failing_since = 0.0
        self.failures = 0
        self._dropped = dropped
        self._seen: set[str] = set()
        self._logged = False  # this streak was logged here (not only by the task itself)

    def failed(self, exc: BaseException, what: str = "failed", *, logged: bool = False) -> None:
        """Count one failed round; one log line per distinct failure while the streak lasts
        (`logged`: the task said so itself)."""
        text = redact_log(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        text = text[:200].rstrip(": ")
        signature = _DIGITS.sub("N", f"{what} {text}")
        if self.failing is None:
            self.failing_since = trio.current_time()
        self.failing, self.failures = f"{what}: {text}", self.failures + 1
        if signature in self._seen or len(self._seen) >= MAX_DISTINCT:
            return
        self._seen.add(signature)
        if not logged:
            self._logged = True
            log.warning("%s: %s (%s); carrying on", self.name, what, text)

    def ok(self) -> None:
        """A round succeeded: the failure streak, if any, is over (one line if it was logged)."""
        if self.failing is not None and self._logged:
            log.warning("%s: working again", self.name)
        self.failing, self._seen, self._logged = None, set(), False

    def dropped(self, queue: str, count: int = 1) -> None:
        if count > 0:
            self._dropped[queue] += count

    def statistics(self, now: float) -> TaskStatistics:
        return TaskStatistics(
            name=self.name,
            failing=self.failing,
            failing_for_s=round(now - self.failing_since, 3) if self.failing is not None else 0.0,
            failures=self.failures,
        )


class Background:
    """Every background task's health, and what they dropped."""

    def __init__(self) -> None:
        self._tasks: dict[str, TaskHealth] = {}
        self._dropped: Counter[str] = Counter()

    def task(self, name: str) -> TaskHealth:
        if name not in self._tasks:
            self._tasks[name] = TaskHealth(name, self._dropped)
        return self._tasks[name]

    def statistics(self) -> BackgroundStatistics:
        now = trio.current_time()
        return BackgroundStatistics(
            tasks=tuple(t.statistics(now) for t in self._tasks.values()),
            dropped=dict(self._dropped),
        )

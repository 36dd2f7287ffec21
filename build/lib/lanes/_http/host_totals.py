"""`/metrics` under `lanes serve --workers N`: the host's totals, whichever worker answers.

Each worker's counters live in its own process, and a scrape reaches whichever worker accepts it.
So every worker writes its tally (jobs, attempts, tokens, cost, the latency histograms, the
exploration counts) to a file of its own in its parent's private directory — whenever it answers
a scrape, and every `PUBLISH_S` — and a scrape adds the live tally of the worker answering to the
files of all the others. A worker that exits leaves its file: its counts stay in the host's
totals, so a counter never goes backwards while the host runs (a worker started again writes a
new file: files are named by process id). Gauges come from the shared state, as before.

Bounded: at most `MAX_FILES` files are read, each at most `MAX_FILE_BYTES`, each checked as
untrusted (`tally.from_json`); when more processes than `MAX_FILES / 2` have written one, the
files of the processes that are gone are folded into one, under a lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import trio

from lanes._core.audit import tally
from lanes._core.audit.statistics import Statistics

log = logging.getLogger("lanes.metrics")

PUBLISH_S = 1.0
MAX_FILES = 256
MAX_FILE_BYTES = 16 * 1024 * 1024
RETIRED = "retired.json"  # the folded files of processes that are gone


@attrs.frozen(kw_only=True)
class _Part:
    tally: tally.TallyStatistics
    explored: int = 0
    explored_served: int = 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class HostTotals:
    """This worker's side of the host's totals: `statistics()` is what `/metrics` reads."""

    def __init__(self, directory: Path, statistics: Callable[[], Statistics]) -> None:
        self._dir = directory
        self._dir.mkdir(mode=0o700, exist_ok=True)
        self._own = self._dir / f"{os.getpid()}.json"
        self._statistics = statistics

    def statistics(self) -> Statistics:
        """This process's statistics with the counters of every worker of the host added."""
        stats = self._statistics()
        mine = _mine(stats)
        _write(self._own, mine)
        host = _added([mine, *self._others()])  # its fields are the counters `Statistics` has
        return attrs.evolve(stats, **attrs.asdict(host, recurse=False))

    async def publish_every(self, period_s: float = PUBLISH_S) -> None:
        """Write this worker's tally every `period_s` (so a scrape another worker answers sees
        the jobs this one finished since its last scrape), until cancelled."""
        while True:
            await trio.sleep(period_s)
            try:
                _write(self._own, _mine(self._statistics()))
            except OSError as exc:  # a full disk costs freshness, never the worker
                log.warning("host metrics: can not write this worker's totals (%s)", exc)

    @contextlib.contextmanager
    def _locked(self, how: int) -> Iterator[None]:
        with (self._dir / "lock").open("a") as lock:
            fcntl.flock(lock, how)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _others(self) -> list[_Part]:
        """Every other worker's last totals, read under the lock (a fold in between would
        otherwise let one file count twice: once whole, once inside `RETIRED`)."""
        if len(list(self._dir.glob("*.json"))) > MAX_FILES // 2:
            self._fold()
        with self._locked(fcntl.LOCK_SH):
            files = sorted(p for p in self._dir.glob("*.json") if p != self._own)
            return [part for p in files[:MAX_FILES] if (part := _read(p)) is not None]

    def _fold(self) -> None:
        """Add the files of processes that are gone into `RETIRED`, then remove them — under the
        lock, so two workers folding at once never count a file twice."""
        with self._locked(fcntl.LOCK_EX):
            gone = [
                p
                for p in self._dir.glob("*.json")
                if p.stem.isdigit() and p != self._own and not _alive(int(p.stem))
            ]
            if not gone:
                return
            retired = self._dir / RETIRED
            parts = [part for p in [retired, *gone] if (part := _read(p)) is not None]
            _write(retired, _added(parts))
            for p in gone:
                p.unlink(missing_ok=True)


def _mine(stats: Statistics) -> _Part:
    return _Part(tally=stats.tally, explored=stats.explored, explored_served=stats.explored_served)


def _added(parts: list[_Part]) -> _Part:
    return _Part(
        tally=tally.summed([p.tally for p in parts]),
        explored=sum(p.explored for p in parts),
        explored_served=sum(p.explored_served for p in parts),
    )


def _write(path: Path, part: _Part) -> None:
    """`part` to `path`, whole: written aside and renamed, so a reader sees the old or the new."""
    data = attrs.asdict(part, recurse=False) | {"tally": tally.to_json(part.tally)}
    staged = path.with_suffix(".tmp")
    staged.write_text(json.dumps(data))
    staged.replace(path)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _read(path: Path) -> _Part | None:
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_FILE_BYTES + 1)
        data = json.loads(raw) if len(raw) <= MAX_FILE_BYTES else None
    except (OSError, ValueError):
        return None  # gone meanwhile, or not ours: nothing to add
    if not isinstance(data, dict) or (counted := tally.from_json(data.get("tally"))) is None:
        return None
    return _Part(
        tally=counted,
        explored=_count(data.get("explored")),
        explored_served=_count(data.get("explored_served")),
    )

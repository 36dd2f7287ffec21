"""The wall source: the one place the engine reads wall-clock time (`EpochTime`).

It is read whenever a calendar decision is made — a quota window, a backoff's deadline, the
ledger's day, an expiry, a report window — never once at start-up and extrapolated on the
monotonic clock (which stops during a suspend and never sees an NTP step).

- In a real run it reads the system's wall clock (the `time` module's) at every call.
- Under trio's `MockClock` (tests, `autojump_clock`, simulated days in benchmarks) the world is
  simulated: the wall is the epoch read at open plus trio's virtual time, so it advances with
  virtual time and a test is deterministic.
- `epoch_now` (`open_dispatcher(epoch_now=…)`) asks for a wall derived from trio's clock from that
  epoch on, in a real run too.
- `step(s)` moves it (tests); `LANES_DRILL_WALL_OFFSET_S` moves it from the start (the `clock-step`
  drill: a process whose day is ahead).

`reference()` is the host's own clock, which every process on the host shares: the system clock
(or, under `MockClock`, the simulated one), never moved by `step` or the drill offset. The state
store's clock check compares the two (see `state/clock.py`).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping

import trio

from lanes._core.model.clocks import EpochTime
from lanes._core.model.errors import ConfigError

OFFSET_ENV = "LANES_DRILL_WALL_OFFSET_S"
MAX_OFFSET_S = 7 * 86400.0


class Wall:
    """Wall-clock epoch seconds, read when asked. Safe to call from a worker thread."""

    def __init__(self, *, base: float | None = None, simulated: bool = False) -> None:
        """`base`: derive the wall from trio's clock, reading `base` now (None: the system clock).
        `simulated`: the host's own clock is derived too (trio's `MockClock`)."""
        self._clock = trio.lowlevel.current_clock() if base is not None else None
        self._base = 0.0 if base is None or self._clock is None else base - self._trio()
        self._simulated = simulated and self._clock is not None
        self.offset_s = 0.0  # steps and the drill offset

    def _trio(self) -> float:
        assert self._clock is not None
        return float(self._clock.current_time())

    def _read(self) -> float:
        if self._clock is None:
            return time.time()  # wall-clock: the wall source itself, read at every decision
        return self._trio() + self._base

    def __call__(self) -> EpochTime:
        return EpochTime(self._read() + self.offset_s)

    def reference(self) -> EpochTime:
        """The host's own clock: what every process on this host reads."""
        if self._simulated:
            return EpochTime(self._trio() + self._base)
        return EpochTime(time.time())  # wall-clock: the host's clock, the one a wall is checked by

    def step(self, seconds: float) -> None:
        """Move this wall by `seconds` (a test stepping the clock, or the drill offset)."""
        self.offset_s += seconds


def open_wall(epoch_now: float | None = None, env: Mapping[str, str] | None = None) -> Wall:
    """The wall source of a dispatcher opened now, under trio (see the module docstring)."""
    testing = sys.modules.get("trio.testing")  # no MockClock without it (and it is slow to load)
    simulated = testing is not None and isinstance(trio.lowlevel.current_clock(), testing.MockClock)
    if epoch_now is not None:
        wall = Wall(base=epoch_now, simulated=simulated)
    elif simulated:
        wall = Wall(base=time.time(), simulated=True)  # wall-clock: the simulation's epoch
    else:
        wall = Wall()
    wall.step(drill_offset(env or {}))
    return wall


def drill_offset(env: Mapping[str, str]) -> float:
    """The drill hook `LANES_DRILL_WALL_OFFSET_S`: seconds this process's wall is moved by (0.0
    when unset). It can not raise the ceiling — a process whose wall disagrees with the state
    store's clock closes paid — but it is said loudly. Raises `ConfigError` for a value that is not
    a number of seconds within a week."""
    raw = env.get(OFFSET_ENV, "").strip()
    if not raw:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or abs(value) > MAX_OFFSET_S:
        raise ConfigError(
            f"{OFFSET_ENV}: {raw[:40]!r} is not a number of seconds within ±{MAX_OFFSET_S:g} "
            "(a drill hook); unset it",
            key=OFFSET_ENV,
        )
    return value

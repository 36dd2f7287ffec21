"""A tight bound for `bench/batchday.py`: the most batch items any scheduler could serve free
under lanes' headroom rule over the same day of interactive arrivals, found by a mixed-integer
program (HiGHS, through `highspy`) instead of `bench/batchbound.py`'s max-flow.

The max-flow bound lets a provider take interactive jobs at no cost to the batch from the first
minute its use *could* reach d, and counts as surely served free only the room no schedule can
take away; both are loose on the simulated day (its bound 3,366 against the oracle's 3,287). This
program keeps every rule of the model `bench/batchbound.py` states, per provider p (R, D, r, d as
there) and minute m, and relaxes only the whole numbers of requests (counts are real numbers;
the minutes' done-or-not flags stay whole):
- b[p,m] ≤ r batch starts, a[p,m] interactive jobs before the batch's last start on p (they
  count against d: Σb + Σa ≤ d, since an item starts only while the day's use is below d),
  e[p,m] interactive jobs once the batch is done with p (z[p,m+1] = 0: no start after m; z only
  falls), b + a + e ≤ R a minute, the day's use u ≤ D;
- the interactive jobs of a minute are all served free (y[m] = 0), or a job went to the paid
  lane — then every provider was full, by its minute (b + a + e = R) or its day
  (w[p,m] = 1: u = D): lanes' free-first routing;
- past `horizon` minutes the program drops the second rule (fewer rules: still a bound) and lets
  the batch start r a minute until the window ends.
Every schedule the brute force of `tests/test_bench_batchday.py` tries is a solution, a batch
start after that minute's interactive jobs too (its jobs are then a's or e's). The optimum is an
upper bound; when the solver stops at its time limit, its proven dual bound is one too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import attrs

from bench.batchbound import Limits


@attrs.frozen(kw_only=True)
class Tight:
    """`upper`: no schedule serves more items; `optimal`: the solver closed its gap (otherwise
    `upper` is its proven dual bound); `horizon`: the minutes modelled one by one; `seconds`:
    the solver's time."""

    upper: int
    optimal: bool
    horizon: int
    seconds: float


@attrs.frozen(kw_only=True)
class Full:
    """One provider in one minute, for the forcing rule: its variables of the minute's use
    (b, a, e), of the day's use at the minute's end, and its quotas."""

    minute: tuple[int, int, int]
    day: int | None  # None: its day can not be full yet
    rpm: int
    rpd: int


@attrs.define
class _Program:
    """A mixed-integer program in rows: variables by index, rows as {index: coefficient}."""

    most: list[float] = attrs.Factory(list)  # each variable's upper limit (all start at 0)
    binary: list[int] = attrs.Factory(list)
    rows: list[tuple[dict[int, float], float, float]] = attrs.Factory(list)

    def var(self, upper: float, *, whole: bool = False) -> int:
        self.most.append(upper)
        if whole:
            self.binary.append(len(self.most) - 1)
        return len(self.most) - 1

    def row(self, coefs: dict[int, float], lower: float = -math.inf, upper: float = math.inf):
        self.rows.append((coefs, lower, upper))

    def maximise(self, objective: list[int], time_limit: float) -> tuple[float, bool, float]:
        """(the bound, whether proved optimal, seconds)."""
        import highspy  # the bench's own dependency
        import numpy as np

        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("time_limit", float(time_limit))
        h.setOptionValue("mip_rel_gap", 0.0)
        inf = h.getInfinity()
        n = len(self.most)
        h.addVars(n, np.zeros(n), np.array([min(v, inf) for v in self.most]))
        cost = np.zeros(n)
        cost[objective] = 1.0
        h.changeColsCost(n, np.arange(n, dtype=np.int32), cost)
        h.changeObjectiveSense(highspy.ObjSense.kMaximize)
        kinds = np.array([highspy.HighsVarType.kInteger] * len(self.binary))
        h.changeColsIntegrality(len(self.binary), np.array(self.binary, dtype=np.int32), kinds)
        starts: list[int] = []
        index: list[int] = []
        value: list[float] = []
        lower: list[float] = []
        upper: list[float] = []
        for coefs, lo, hi in self.rows:
            starts.append(len(index))
            index.extend(coefs)
            value.extend(coefs.values())
            lower.append(max(lo, -inf))
            upper.append(min(hi, inf))
        h.addRows(
            len(self.rows),
            np.array(lower),
            np.array(upper),
            len(index),
            np.array(starts, dtype=np.int32),
            np.array(index, dtype=np.int32),
            np.array(value),
        )
        h.run()
        info = h.getInfo()
        optimal = h.getModelStatus() == highspy.HighsModelStatus.kOptimal
        found = info.objective_function_value if optimal else info.mip_dual_bound
        return found, optimal, h.getRunTime()


def tight_upper(
    arrivals: Mapping[int, int],
    *,
    items: int,
    minutes: int,
    limits: Limits,
    horizon: int,
    time_limit: float = 300.0,
) -> Tight:
    """The module's program for `arrivals[minute]` interactive jobs a minute, the batch's `items`
    all waiting from minute 0 for `minutes`, the forcing rule kept for the first `horizon`."""
    horizon = min(horizon, minutes)
    program = _Program()
    starts: list[int] = []
    placed: dict[int, list[int]] = {m: [] for m in range(horizon)}
    full: dict[int, list[Full]] = {m: [] for m in range(horizon)}
    for quota in limits.values():
        starts += _provider(program, quota, horizon, minutes, placed, full)
    program.row(dict.fromkeys(starts, 1.0), upper=items)
    for m in range(horizon):
        _forced(program, arrivals.get(m, 0), placed[m], full[m])
    found, optimal, seconds = program.maximise(starts, time_limit)
    return Tight(
        upper=min(items, math.floor(found + 1e-6)),
        optimal=optimal,
        horizon=horizon,
        seconds=seconds,
    )


def _provider(
    program: _Program,
    quota: tuple[int, int, int, int],
    horizon: int,
    minutes: int,
    placed: dict[int, list[int]],
    full: dict[int, list[Full]],
) -> list[int]:
    """One provider's variables and rows; returns its batch starts, adds its interactive
    placements to `placed` and what says it is full to `full`, for the forcing rule."""
    rpm, rpd, r, d = quota
    z = [program.var(1, whole=True) for _ in range(horizon + 1)]
    used = program.var(0)  # the day's use before minute 0
    starts, counted = [], []
    for m in range(horizon):
        b, a, e = program.var(r), program.var(rpm), program.var(rpm)
        program.row({b: 1, z[m]: -r}, upper=0)  # a start only while the batch goes on
        program.row({e: 1, z[m + 1]: rpm}, upper=rpm)  # free of cost once it is done
        program.row({b: 1, a: 1, e: 1}, upper=rpm)
        program.row({z[m + 1]: 1, z[m]: -1}, upper=0)
        after = program.var(rpd)
        program.row({after: 1, used: -1, b: -1, a: -1, e: -1}, 0, 0)
        used = after
        starts.append(b)
        counted.append(a)
        placed[m] += [a, e]
        fills = rpm * (m + 1) >= rpd  # its day could be full by the minute's end
        full[m].append(Full(minute=(b, a, e), day=after if fills else None, rpm=rpm, rpd=rpd))
    rest = max(0, minutes - horizon) * r
    tail = program.var(rest)
    program.row({tail: 1, z[horizon]: -rest}, upper=0)
    program.row({used: 1, tail: 1}, upper=rpd)
    program.row(dict.fromkeys([*starts, *counted, tail], 1.0), upper=d)
    return [*starts, tail]


def _forced(program: _Program, count: int, placed: list[int], full: list[Full]) -> None:
    """A minute's `count` jobs go free (y = 0), or every provider is full by its minute or its
    day (y = 1)."""
    if not count:
        return
    y = program.var(1, whole=True)
    program.row(dict.fromkeys(placed, 1.0) | {y: count}, lower=count)
    for one in full:
        if one.day is None:
            program.row(dict.fromkeys(one.minute, 1.0) | {y: -one.rpm}, lower=0)
            continue
        w = program.var(1, whole=True)  # full by its day
        program.row(dict.fromkeys(one.minute, 1.0) | {y: -one.rpm, w: one.rpm}, lower=0)
        program.row({w: 1, y: -1}, upper=0)
        program.row({one.day: 1, w: -one.rpd}, lower=0)

"""Know before you change: `lanes.whatif(config, audit)` replays the audit's jobs of a window under
a config — on a virtual clock, through the real dispatcher, against in-process providers with the
config's quotas and prices — and returns the figures beside what was recorded and the oracle's
bound on the free share. `lanes whatif` prints them. How to read them: docs/whatif.md.

```python
result = lanes.whatif("new.toml", "state/lanes.db", since="7d", against="lanes.toml")
result.new.free_share, result.new.paid_usd, result.new.days[0].reached_at
```
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import attrs

from lanes._core.audit.report import parse_since
from lanes._core.config.schema import Config, read_config
from lanes._whatif.figures import Figures, summarise
from lanes._whatif.oracle import Need, ScopeLimits, bound
from lanes._whatif.recorded import Recorded, RecordedWindow, read_window
from lanes._whatif.replay import MAX_IN_FLIGHT, Replayed, replay

__all__ = ["Fidelity", "Figures", "WhatIf", "whatif"]

#: The tolerance: a replay of the recorded config should reproduce the recorded free share within
#: this share of the jobs (quotas are counted in fixed windows here, and latency is as recorded,
#: so the two differ only where timing decides). Each run measures it (`Fidelity`) and warns when
#: it misses; tests/test_whatif.py checks a simulated day holds it.
TOLERANCE = 0.05


@attrs.frozen(kw_only=True)
class Fidelity:
    """The fidelity check: the config that served the window (`label`) replayed against its own
    audit — how far the replay's free share lands from the recorded one, and the lane whose
    count of jobs served misses most."""

    label: str
    recorded_share: float
    replayed_share: float
    miss: float  # |replayed - recorded| free share, a share of the jobs (0.05: 5 points)
    lane: str  # the lane whose jobs served differ most ("" when none differ)
    lane_miss: int  # by how many jobs
    faults: bool  # whether the recorded failures were replayed
    tolerance: float = TOLERANCE

    @property
    def within(self) -> bool:
        return self.miss <= self.tolerance + 1e-12


@attrs.frozen(kw_only=True)
class WhatIf:
    """The answer: the window, the recorded figures, the new config's, and (with `against`) the
    current config's — each replayed config with the oracle's bound — and what to know of them."""

    since: float
    until: float
    jobs: int
    recorded: Figures
    new: Figures
    against: Figures | None
    notes: tuple[str, ...]
    wall_s: float
    fidelity: Fidelity | None = None  # None: no config known to have served the window
    warnings: tuple[str, ...] = ()  # what makes the figures less than they look

    @property
    def columns(self) -> list[Figures]:
        return [self.recorded, *([self.against] if self.against else []), self.new]


def whatif(
    config: Config | str | os.PathLike[str],
    audit: str | os.PathLike[str],
    *,
    since: str | float = "7d",
    until: float | None = None,
    against: Config | str | os.PathLike[str] | None = None,
    faults: bool = False,
    progress: Callable[[int, int], None] | None = None,
    processes: int | None = None,
    served: bool = False,
    environ: Mapping[str, str] | None = None,
) -> WhatIf:
    """Replay the jobs `audit` (a SQLite state file) recorded in the window under `config` (and
    `against`). `since`: "7d", "12h", a UTC date, or epoch seconds; `until` defaults to now.
    `faults`: the failures the audit recorded are answered again, for as long as they were
    observed. The fidelity check is the replay of `against` (the config that served the window),
    or of `config` when `served` says it is that config; without either, it is not measured (the
    notes say so). A lane whose key `environ` (default: this process's environment) does not set
    is off in the replay, as at start. With `against`, the two replays run in two processes
    (`processes=1`: one after the other, here). Never reaches the network; reads the audit
    read-only and opens no other file of the configs' (their state stays in memory). Runs its own
    trio loop: from inside one, call it in a thread."""
    started = time.perf_counter()  # wall-clock: how long the answer took
    now = time.time() if until is None else until  # wall-clock: the window ends now
    start = float(since) if isinstance(since, int | float) else parse_since(since, now)
    window = read_window(audit, start, now)
    new = _config(config)
    current = None if against is None else _config(against)
    jobs = window.jobs
    fault_list = window.faults if faults else ()
    configs = [c for c in (current, new) if c is not None]
    env = dict(os.environ if environ is None else environ)
    if len(configs) == 2 and processes != 1 and len(jobs) > 1000:
        # the current config in a second process, the new one here (with the progress bar)
        from concurrent.futures import ProcessPoolExecutor  # only when asked for

        with ProcessPoolExecutor(max_workers=1) as pool:
            other = pool.submit(
                replay, configs[0], jobs, since=start, faults=fault_list, environ=env
            )
            mine = replay(
                configs[1], jobs, since=start, faults=fault_list, progress=progress, environ=env
            )
            runs = [other.result(), mine]
    else:
        runs = [
            replay(c, jobs, since=start, faults=fault_list, progress=progress, environ=env)
            for c in configs
        ]
    named = _labels(config, against)
    figures = [
        summarise(
            label,
            run.rows,
            ceiling_usd=c.policy.paid_ceiling_usd_per_day,
            oracle_free=oracle_of(run, jobs, default_deadline_s=c.default_deadline_s),
        )
        for label, run, c in zip(named, runs, configs, strict=True)
    ]
    recorded_ceiling = (current or new).policy.paid_ceiling_usd_per_day
    recorded = summarise("recorded", _rows(jobs), ceiling_usd=recorded_ceiling)
    check = None
    if current is not None or served:
        check = fidelity(recorded, figures[0], faults=faults)
    return WhatIf(
        since=start,
        until=now,
        jobs=len(jobs),
        recorded=recorded,
        new=figures[-1],
        against=figures[0] if current is not None else None,
        notes=tuple(_notes(window, runs, named, check)),
        wall_s=time.perf_counter() - started,
        fidelity=check,
        warnings=tuple(_warnings(check, window, faults=faults)),
    )


def fidelity(recorded: Figures, replayed: Figures, *, faults: bool) -> Fidelity | None:
    """How far the replay of the config that served the window lands from what was recorded
    (None for an empty window: nothing to compare)."""
    if recorded.free_share is None or replayed.free_share is None:
        return None
    lanes = set(recorded.by_lane) | set(replayed.by_lane)
    misses = sorted(
        ((abs(recorded.by_lane.get(n, 0) - replayed.by_lane.get(n, 0)), n) for n in lanes),
        key=lambda item: (-item[0], item[1]),
    )
    lane_miss, lane = misses[0] if misses and misses[0][0] else (0, "")
    return Fidelity(
        label=replayed.label,
        recorded_share=recorded.free_share,
        replayed_share=replayed.free_share,
        miss=abs(replayed.free_share - recorded.free_share),
        lane=lane,
        lane_miss=lane_miss,
        faults=faults,
    )


def _failures_said(window: RecordedWindow) -> str:
    words = {
        "connect": "refused connections",
        "reset": "reset connections",
        "server_error": "server errors or timeouts",
        "rate_limited": "429s",
        "credit_exhausted": "402s",
    }
    return "; ".join(
        f"{lane}: "
        + ", ".join(f"{n:,} {words.get(kind, kind)}" for kind, n in sorted(kinds.items()))
        for lane, kinds in sorted(window.failures.items())
    )


def _warnings(check: Fidelity | None, window: RecordedWindow, *, faults: bool) -> list[str]:
    said = []
    if check is not None and not check.within:
        said.append(
            f"the replay of {check.label} misses its own audit by "
            f"{100 * check.miss:.1f} points of free share (tolerance "
            f"{100 * check.tolerance:.0f}): read every figure with that in mind"
        )
    failed = sum(n for kinds in window.failures.values() for n in kinds.values())
    if failed and not faults:
        said.append(
            f"the window had {failed:,} failed attempts the replay leaves out "
            f"({_failures_said(window)}): --faults replays them as observed"
        )
    return said


def _config(value: Config | str | os.PathLike[str]) -> Config:
    return value if isinstance(value, Config) else read_config(value, env={})


def _labels(config: object, against: object) -> list[str]:
    def name(value: object, default: str) -> str:
        return Path(value).name if isinstance(value, str | os.PathLike) else default

    new = name(config, "new")
    if against is None:
        return [new]
    old = name(against, "current")
    return [old, new if new != old else f"{new} (new)"]


def oracle_of(run: Replayed, jobs: Sequence[Recorded], *, default_deadline_s: float = 30.0) -> int:
    """The oracle's bound for one replay: each job's free candidates are those its plan held; a
    job the audit kept no deadline of has the replayed config's `default_deadline_s`, as in the
    replay."""
    limits = {}
    for lane in run.lanes.values():
        for model in lane.models:
            if lane.limited(model):
                limits[lane.scope(model)] = ScopeLimits(rpm=lane.limits.rpm, rpd=lane.limits.rpd)
    needs = []
    for row in run.rows:
        index = int(row.get("index", -1))
        if not 0 <= index < len(jobs):
            continue
        keys = _plan(row)
        if row.get("outcome") == "ok" and row.get("lane"):
            keys.append(f"{row['lane']}/{row['model']}")
        scopes, unlimited = set(), False
        for key in keys:
            if run.tiers.get(key) not in ("local", "free"):
                continue
            lane_name, _, model = key.partition("/")
            found = run.lanes.get(lane_name)
            if found is None or not found.limited(model):
                unlimited = True
            else:
                scopes.add(found.scope(model))
        needs.append(
            Need(
                arrived=jobs[index].arrived,
                deadline_s=jobs[index].deadline_s or default_deadline_s,
                scopes=frozenset(scopes),
                unlimited=unlimited,
            )
        )
    return bound(needs, limits)


def _plan(row: Mapping[str, object]) -> list[str]:
    raw = row.get("plan")
    try:
        plan = json.loads(raw) if isinstance(raw, str) else []
    except ValueError:
        return []
    return [k for k in plan if isinstance(k, str)]


def _rows(jobs: Sequence[Recorded]) -> list[dict[str, object]]:
    return [
        {
            "at": job.arrived + job.latency_s,
            "outcome": job.outcome,
            "route": job.route,
            "lane": job.lane,
            "tier": job.tier,
            "cost_usd": job.cost_usd,
            "approval": job.approval,
        }
        for job in jobs
    ]


def _fidelity_note(check: Fidelity | None) -> str:
    if check is None:
        return (
            "fidelity not measured: no config known to have served the window "
            "(pass --against it to replay it against its own audit)"
        )
    lane = (
        f"; {check.lane} served {check.lane_miss:,} jobs more or fewer than recorded"
        if check.lane
        else "; every lane served as many jobs as recorded"
    )
    return (
        f"fidelity: {check.label} replayed against its own audit "
        f"{'with' if check.faults else 'without'} the recorded failures gives "
        f"{100 * check.replayed_share:.1f} % free where {100 * check.recorded_share:.1f} % was "
        f"recorded: {'within' if check.within else 'MISSES'} {100 * check.miss:.1f} points "
        f"(tolerance {100 * check.tolerance:.0f}){lane}"
    )


def _notes(
    window: RecordedWindow,
    runs: Sequence[Replayed],
    labels: Sequence[str],
    check: Fidelity | None = None,
) -> list[str]:
    notes = [
        "free share counts every job of the window, failed ones included; the oracle's bound is "
        "the most any router could have served free from the candidates each job's plan held, "
        "under the requests-a-minute and requests-a-day quotas (token, monthly and credit limits "
        "relaxed: a higher bound, never a lower one)",
        _fidelity_note(check),
    ]
    if window.older_rows:
        notes.append(
            f"{window.older_rows:,} jobs were audited by an older version: their model asked "
            "(read as auto), stream and output cap are guessed"
        )
    if window.left_out:
        notes.append(f"{window.left_out:,} jobs past the first {len(window.jobs):,} not replayed")
    for label, run in zip(labels, runs, strict=True):
        if run.late:
            notes.append(
                f"{label}: {run.late:,} jobs started after their arrival: more than "
                f"{MAX_IN_FLIGHT:,} were in flight at once (the replay's bound on its memory)"
            )
        if run.unkeyed:
            unkeyed = sorted(run.unkeyed.items())
            notes.append(
                f"{label}: {', '.join(lane for lane, _ in unkeyed)} "
                f"{'is' if len(unkeyed) == 1 else 'are'} not counted as serving: "
                f"{', '.join('$' + var for _, var in unkeyed)} "
                f"{'is' if len(unkeyed) == 1 else 'are'} not set in this environment (set "
                f"{'it' if len(unkeyed) == 1 else 'them'} to replay "
                f"{'the lane' if len(unkeyed) == 1 else 'those lanes'})"
            )
        if run.unstated:
            notes.append(
                f"{label}: {', '.join(run.unstated)} state no limits in the config: never "
                "refused in the replay (state rpm/rpd to replay them)"
            )
    return notes

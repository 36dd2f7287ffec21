"""What every finished job adds to the running totals `/metrics` shows: jobs and attempts by
outcome, latency histograms per route state, tokens and cost by lane, model, route and cohort.
Pure: the journal feeds it each job's record; `statistics()` takes a frozen copy.

Label sets stay bounded whatever clients send: a cohort (`X-Lanes-Cohort`, free text) is a label
when it is declared (`[metrics] cohorts`, the clients' defaults) or a trusted (admin) client's —
at most `max_cohorts` of those — and "other" otherwise, so no client's values take the labels
another's would use; models beyond `max_models` count as "other" too (a catalog can be long).
"""

from __future__ import annotations

# lanes: pure
import bisect
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from lanes._core.freetier.prices import usage_tokens
from lanes._core.model.candidates import Attempt

#: Upper bounds (seconds) of the latency histograms' buckets.
BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
OTHER = "other"
NONE = "none"  # no route reached / no lane served


@attrs.frozen(kw_only=True)
class Histogram:
    """Counts per bucket of `BUCKETS` (not cumulative) plus the overflow, and the sum, seconds."""

    counts: tuple[int, ...]
    sum_s: float

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        """(upper bound, observations at or below it) as Prometheus buckets, `+Inf` last."""
        out, running = [], 0
        for bound, n in zip((*(f"{b:g}" for b in BUCKETS), "+Inf"), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out


def _observe(counts: list[float], value_s: float) -> None:
    """Count one observation into a histogram being kept: its buckets' counts, then its sum."""
    # the first bucket whose bound holds it (a NaN, holding in none, is overflow)
    counts[bisect.bisect_left(BUCKETS, value_s) if value_s == value_s else len(BUCKETS)] += 1
    counts[-1] += value_s


def _frozen(counts: list[float]) -> Histogram:
    return Histogram(counts=tuple(int(n) for n in counts[:-1]), sum_s=counts[-1])


@attrs.frozen(kw_only=True)
class TallyStatistics:
    """The totals since this process started. Keys are label tuples, in the order named."""

    jobs: Mapping[tuple[str, str, str, str], int]  # (route, lane, model, outcome)
    attempts: Mapping[tuple[str, str, str, str], int]  # (lane, model, route, outcome)
    tokens: Mapping[tuple[str, str, str, str, str], int]  # (lane, model, route, cohort, kind)
    cost_usd: Mapping[tuple[str, str, str, str], float]  # (lane, model, route, cohort)
    job_latency: Mapping[str, Histogram]  # route reached → whole-job latency
    attempt_latency: Mapping[str, Histogram]  # route state → one attempt's latency


class Tally:
    def __init__(
        self,
        *,
        declared: frozenset[str] = frozenset(),
        max_cohorts: int = 20,
        max_models: int = 200,
    ) -> None:
        self._max_cohorts, self._max_models = max_cohorts, max_models
        self._declared = declared
        self._cohorts: set[str] = set()  # the trusted clients' undeclared cohorts labelled
        self._models: set[str] = set()
        self._jobs: Counter[tuple[str, str, str, str]] = Counter()
        self._attempts: Counter[tuple[str, str, str, str]] = Counter()
        self._tokens: Counter[tuple[str, str, str, str, str]] = Counter()
        self._cost: dict[tuple[str, str, str, str], float] = {}
        # histograms being kept: each bucket's count (overflow last), then the sum of seconds
        self._job_latency: dict[str, list[float]] = {}
        self._attempt_latency: dict[str, list[float]] = {}

    def _bounded(self, seen: set[str], value: str, limit: int) -> str:
        if value in seen:
            return value
        if len(seen) >= limit:
            return OTHER
        seen.add(value)
        return value

    def _cohort(self, cohort: str | None, trusted: bool) -> str:
        if not cohort:
            return NONE
        if cohort in self._declared:
            return cohort
        return self._bounded(self._cohorts, cohort, self._max_cohorts) if trusted else OTHER

    def _model(self, lane: str, model: str) -> str:
        return self._bounded(self._models, f"{lane}/{model}", self._max_models).partition("/")[2]

    def job(
        self,
        *,
        route: str | None,
        lane: str,
        model: str,
        outcome: str,
        cohort: str | None,
        latency_s: float,
        attempts: Sequence[Attempt],
        usage: Any = None,
        trusted: bool = True,
    ) -> None:
        """Count one finished job: `lane`/`model` served it ("" when none did). `trusted`: its
        client may add cohort labels (an admin)."""
        cohort_label = self._cohort(cohort, trusted)
        served = (lane or NONE, self._model(lane, model) if lane else NONE)
        route_label = route or NONE
        self._jobs[(route_label, *served, outcome)] += 1
        _observe(self._kept(self._job_latency, route_label), latency_s)
        for a in attempts:
            key = (a.lane, self._model(a.lane, a.model), a.route)
            self._attempts[(*key, a.outcome)] += 1
            _observe(self._kept(self._attempt_latency, a.route), a.duration_s)
            if a.cost_usd:
                where = (*key, cohort_label)
                self._cost[where] = self._cost.get(where, 0.0) + a.cost_usd
        counted = usage_tokens(usage) if lane else None
        if counted is not None:
            for kind, n in zip(("prompt", "completion"), counted, strict=True):
                self._tokens[(*served, route_label, cohort_label, kind)] += n

    @staticmethod
    def _kept(histograms: dict[str, list[float]], label: str) -> list[float]:
        return histograms.setdefault(label, [0] * (len(BUCKETS) + 2))

    def statistics(self) -> TallyStatistics:
        return TallyStatistics(
            jobs=dict(self._jobs),
            attempts=dict(self._attempts),
            tokens=dict(self._tokens),
            cost_usd=dict(self._cost),
            job_latency={k: _frozen(v) for k, v in self._job_latency.items()},
            attempt_latency={k: _frozen(v) for k, v in self._attempt_latency.items()},
        )


#: The counters of a `TallyStatistics`, with each key's length (the label tuple's).
COUNTERS = (("jobs", 4), ("attempts", 4), ("tokens", 5), ("cost_usd", 4))
HISTOGRAMS = ("job_latency", "attempt_latency")


def summed(parts: Sequence[TallyStatistics]) -> TallyStatistics:
    """The totals of several processes' tallies (the workers of one host): counters and
    histograms added label set by label set."""
    out: dict[str, Any] = {}
    for name, _ in COUNTERS:
        total: dict[Any, Any] = {}
        for part in parts:
            for key, value in getattr(part, name).items():
                total[key] = total.get(key, 0) + value
        out[name] = total
    for name in HISTOGRAMS:
        merged: dict[str, Histogram] = {}
        for part in parts:
            for key, h in getattr(part, name).items():
                had = merged.get(key)
                if had is not None:
                    counts = tuple(a + b for a, b in zip(had.counts, h.counts, strict=True))
                    h = Histogram(counts=counts, sum_s=had.sum_s + h.sum_s)
                merged[key] = h
        out[name] = merged
    return TallyStatistics(**out)


def to_json(tally: TallyStatistics) -> dict[str, Any]:
    """`tally` as JSON-able lists (label tuples become lists), for another process to read."""
    out: dict[str, Any] = {
        name: [[*key, value] for key, value in getattr(tally, name).items()] for name, _ in COUNTERS
    }
    for name in HISTOGRAMS:
        out[name] = [[k, list(h.counts), h.sum_s] for k, h in getattr(tally, name).items()]
    return out


def _label(v: Any) -> bool:
    return isinstance(v, str) and len(v) <= 512


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v < 1e18


def _counter_row(row: Any, width: int) -> bool:
    ok = isinstance(row, list) and len(row) == width + 1
    return ok and all(map(_label, row[:width])) and _number(row[width])


def _histogram_row(row: Any) -> bool:
    counts = row[1] if isinstance(row, list) and len(row) == 3 and _label(row[0]) else None
    return (
        isinstance(counts, list)
        and len(counts) == len(BUCKETS) + 1
        and all(isinstance(c, int) and _number(c) for c in counts)
        and _number(row[2])
    )


def from_json(data: Any, max_entries: int = 100_000) -> TallyStatistics | None:
    """What `to_json` wrote, checked entry by entry (None: not a tally, or over `max_entries`
    label sets): a file another process wrote is read as untrusted."""
    if not isinstance(data, dict):
        return None
    out: dict[str, Any] = {}
    entries = 0
    for name, width in COUNTERS:
        rows = data.get(name)
        if not isinstance(rows, list) or (entries := entries + len(rows)) > max_entries:
            return None
        if not all(_counter_row(row, width) for row in rows):
            return None
        out[name] = {tuple(row[:width]): row[width] for row in rows}
    for name in HISTOGRAMS:
        rows = data.get(name)
        if not isinstance(rows, list) or len(rows) > max_entries:
            return None
        if not all(map(_histogram_row, rows)):
            return None
        out[name] = {row[0]: Histogram(counts=tuple(row[1]), sum_s=float(row[2])) for row in rows}
    return TallyStatistics(**out)

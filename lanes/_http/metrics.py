"""Prometheus text exposition: counters kept as jobs pass, gauges read from the dispatcher at
scrape."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from lanes._core.job import Attempt
from lanes._core.statistics import Statistics

BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
STATES = {"closed": 0, "half_open": 1, "open": 2}


def _labels(**kw: str) -> str:
    inner = ",".join(
        f'{k}="{str(v).replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
        for k, v in kw.items()
    )
    return "{" + inner + "}"


class Metrics:
    def __init__(self) -> None:
        self.requests: Counter[tuple[str, str, str]] = Counter()
        self.attempts: Counter[tuple[str, str]] = Counter()
        self.latency: dict[str, list[int]] = {}
        self.latency_sum: dict[str, float] = {}
        self.cost = 0.0

    def job(
        self,
        *,
        route: str,
        lane: str,
        outcome: str,
        latency_s: float,
        attempts: Sequence[Attempt],
        cost: float = 0.0,
    ) -> None:
        self.requests[(route, lane, outcome)] += 1
        for a in attempts:
            self.attempts[(a.lane, a.outcome)] += 1
        buckets = self.latency.setdefault(route, [0] * (len(BUCKETS) + 1))
        for i, bound in enumerate(BUCKETS):
            if latency_s <= bound:
                buckets[i] += 1
        buckets[-1] += 1
        self.latency_sum[route] = self.latency_sum.get(route, 0.0) + latency_s
        self.cost += cost

    def render(self, stats: Statistics) -> str:
        out = [
            "# HELP lanes_requests_total Jobs served or failed, by route, lane and outcome.",
            "# TYPE lanes_requests_total counter",
        ]
        out += [
            f"lanes_requests_total{_labels(route=r, lane=lane, outcome=o)} {n}"
            for (r, lane, o), n in self.requests.items()
        ]
        out += [
            "# HELP lanes_attempts_total Upstream attempts, by lane and outcome.",
            "# TYPE lanes_attempts_total counter",
        ]
        out += [
            f"lanes_attempts_total{_labels(lane=lane, outcome=o)} {n}"
            for (lane, o), n in self.attempts.items()
        ]
        out += [
            "# HELP lanes_job_seconds Job latency by route.",
            "# TYPE lanes_job_seconds histogram",
        ]
        for route, buckets in self.latency.items():
            for bound, n in zip((*map(str, BUCKETS), "+Inf"), buckets, strict=True):
                out.append(f"lanes_job_seconds_bucket{_labels(route=route, le=bound)} {n}")
            out.append(f"lanes_job_seconds_sum{_labels(route=route)} {self.latency_sum[route]:.6f}")
            out.append(f"lanes_job_seconds_count{_labels(route=route)} {buckets[-1]}")
        out += [
            "# HELP lanes_breaker_state A lane's own breaker: 0 closed, 1 half-open, 2 open.",
            "# TYPE lanes_breaker_state gauge",
        ]
        out += [
            f"lanes_breaker_state{_labels(lane=lane.name)} {STATES[lane.breaker.state]}"
            for lane in stats.lanes
        ]
        out += [
            "# HELP lanes_model_breaker_state A model's breaker: 0 closed, 1 half-open, 2 open.",
            "# TYPE lanes_model_breaker_state gauge",
        ]
        out += [
            f"lanes_model_breaker_state{_labels(lane=lane.name, model=m.model)} "
            f"{STATES[m.breaker.state]}"
            for lane in stats.lanes
            for m in lane.models
        ]
        out += [
            "# HELP lanes_backoff_seconds Seconds until a candidate's backoff ends.",
            "# TYPE lanes_backoff_seconds gauge",
        ]
        out += [
            f"lanes_backoff_seconds{_labels(lane=lane.name, model=m.model)} "
            f"{max(0.0, m.backoff_s):.3f}"
            for lane in stats.lanes
            for m in lane.models
        ]
        out += [
            "# HELP lanes_quota_remaining Requests remaining as last reported.",
            "# TYPE lanes_quota_remaining gauge",
        ]
        out += [
            f"lanes_quota_remaining{_labels(lane=lane.name, model=m.model)} "
            f"{m.requests_remaining:g}"
            for lane in stats.lanes
            for m in lane.models
            if m.requests_remaining is not None
        ]
        out += [
            "# HELP lanes_paid_spend_usd Paid spend today (UTC), reserved and settled.",
            "# TYPE lanes_paid_spend_usd gauge",
            f"lanes_paid_spend_usd {stats.paid_spent_today_usd:.6f}",
            "# HELP lanes_explored_total Jobs sent to a runner-up on purpose (exploration).",
            "# TYPE lanes_explored_total counter",
            f"lanes_explored_total {stats.explored}",
            "# HELP lanes_explored_served_total Explored jobs the runner-up served.",
            "# TYPE lanes_explored_served_total counter",
            f"lanes_explored_served_total {stats.explored_served}",
            "# HELP lanes_state_store_up 1 while the state store answers "
            "(Redis: and the paid ledger is synchronised).",
            "# TYPE lanes_state_store_up gauge",
            f"lanes_state_store_up{_labels(kind=stats.store.kind)} {int(stats.store.up)}",
            "# HELP lanes_approvals_pending Paid fallbacks waiting for a decision.",
            "# TYPE lanes_approvals_pending gauge",
            f"lanes_approvals_pending {len(stats.approvals)}",
        ]
        return "\n".join(out + _background(stats)) + "\n"


def _background(stats: Statistics) -> list[str]:
    """The background tasks (state sync, listener, catalogs, balances): failing now, failures so
    far, and what they dropped rather than retry for ever."""
    tasks = stats.background.tasks
    series = (
        ("lanes_task_failing", "gauge", "1 while a background task is failing.", "task"),
        ("lanes_task_failures_total", "counter", "Failed rounds of a background task.", "task"),
        ("lanes_dropped_total", "counter", "Records dropped (poison, or over a bound).", "queue"),
    )
    values = (
        [(t.name, int(t.failing is not None)) for t in tasks],
        [(t.name, t.failures) for t in tasks],
        sorted(stats.background.dropped.items()),
    )
    out = []
    for (name, kind, text, label), rows in zip(series, values, strict=True):
        out += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
        out += [f"{name}{_labels(**{label: key})} {n}" for key, n in rows]
    return out

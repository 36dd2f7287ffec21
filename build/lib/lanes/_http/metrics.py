"""`GET /metrics`: Prometheus exposition by the reference client (`prometheus-client`).

A registry of our own (never the process-global one) holds one custom collector that reads the
dispatcher's frozen `statistics()` at each scrape — totals the journal keeps as jobs finish, and
gauges of the state right now — so the client does the naming (`_total`, units), the family
layout and the escaping of label values. Label sets are bounded: lanes and route states are
configured; the per-model gauges cover each lane's models shown one by one (`[metrics]
models_per_lane`, the most used), `lanes_lane_models` counts them all; the tally caps the models and
cohorts of its counters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from lanes._core.audit.statistics import Statistics
from lanes._core.audit.tally import Histogram

STATES = {"closed": 0, "half_open": 1, "open": 2}
CONTENT_TYPE = CONTENT_TYPE_LATEST
#: a batch's life cycle (OpenAI's), and an item's states: each shown, 0 when none
BATCH_STATUSES = ("validating", "in_progress", "finalizing", "completed", "failed", "expired",
                  "cancelling", "cancelled")  # fmt: skip
ITEM_STATES = ("pending", "running", "completed", "failed")


def _counter(
    name: str, doc: str, labels: tuple[str, ...], values: Mapping[Any, float] | Mapping[Any, int]
) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=list(labels))
    for key, value in sorted(values.items()):
        family.add_metric(list(key), value)
    return family


def _histogram(name: str, doc: str, label: str, values: Mapping[str, Histogram]) -> Metric:
    family = HistogramMetricFamily(name, doc, labels=[label])
    for key, histogram in sorted(values.items()):
        family.add_metric([key], histogram.cumulative(), histogram.sum_s)
    return family


def _gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


class StatisticsCollector(Collector):
    """Every family `/metrics` shows, read from one `statistics()` snapshot per scrape."""

    def __init__(self, statistics: Callable[[], Statistics]) -> None:
        self._statistics = statistics

    def collect(self) -> Iterator[Metric]:
        stats = self._statistics()
        yield from self._totals(stats)
        yield from self._lanes(stats)
        yield from self._health(stats)

    def _totals(self, stats: Statistics) -> Iterator[Metric]:
        tally = stats.tally
        for name, doc, labels, values in (
            (
                "lanes_requests",
                "Jobs finished, by the route reached, the lane and model that served, and outcome.",
                ("route", "lane", "model", "outcome"),
                tally.jobs,
            ),
            (
                "lanes_attempts",
                "Upstream attempts, by lane, model, route state and outcome.",
                ("lane", "model", "route", "outcome"),
                tally.attempts,
            ),
            (
                "lanes_tokens",
                "Tokens of served jobs as reported upstream, by kind (prompt or completion).",
                ("lane", "model", "route", "cohort", "kind"),
                tally.tokens,
            ),
            (
                "lanes_cost_usd",
                "Paid spend settled, in US dollars, by lane, model, route state and cohort.",
                ("lane", "model", "route", "cohort"),
                tally.cost_usd,
            ),
        ):
            yield _counter(name, doc, labels, values)
        yield _histogram(
            "lanes_job_duration_seconds",
            "Whole-job latency by the route reached (none: no lane served).",
            "route",
            tally.job_latency,
        )
        yield _histogram(
            "lanes_attempt_duration_seconds",
            "One upstream attempt's latency by its route state.",
            "route",
            tally.attempt_latency,
        )
        yield CounterMetricFamily(
            "lanes_explored", "Jobs sent to a runner-up on purpose (exploration).", stats.explored
        )
        served = "Explored jobs the runner-up served."
        yield CounterMetricFamily("lanes_explored_served", served, stats.explored_served)

    def _lanes(self, stats: Statistics) -> Iterator[Metric]:
        lane_breaker = _gauge(
            "lanes_breaker_state", "A lane's own breaker: 0 closed, 1 half-open, 2 open.", ("lane",)
        )
        lane_off = _gauge("lanes_lane_off", "1 while a lane is switched off.", ("lane",))
        model_breaker = _gauge(
            "lanes_model_breaker_state",
            "A model's breaker: 0 closed, 1 half-open, 2 open.",
            ("lane", "model"),
        )
        backoff = _gauge(
            "lanes_backoff_seconds", "Seconds until a candidate's backoff ends.", ("lane", "model")
        )
        remaining = _gauge(
            "lanes_quota_remaining_requests",
            "Requests remaining as last reported, while its window has not reset.",
            ("lane", "model"),
        )
        quarantined = _gauge(
            "lanes_model_quarantined",
            "1 while the canary keeps a model out of routing.",
            ("lane", "model"),
        )
        models = _gauge(
            "lanes_lane_models",
            "A lane's models: routable, and of them free now.",
            ("lane", "state"),
        )
        for lane in stats.lanes:
            lane_breaker.add_metric([lane.name], STATES[lane.breaker.state])
            lane_off.add_metric([lane.name], int(lane.off))
            count = len(lane.models) + (lane.other.models if lane.other else 0)
            models.add_metric([lane.name, "routable"], count)
            models.add_metric([lane.name, "free_now"], lane.free_now)
            for m in lane.models:
                labels = [lane.name, m.model]
                model_breaker.add_metric(labels, STATES[m.breaker.state])
                backoff.add_metric(labels, max(0.0, m.backoff_s))
                quarantined.add_metric(labels, int(m.quarantined is not None))
                if m.requests_remaining is not None:
                    remaining.add_metric(labels, m.requests_remaining)
        yield from (lane_breaker, lane_off, models, model_breaker, backoff, remaining, quarantined)

    def _health(self, stats: Statistics) -> Iterator[Metric]:
        spend = _gauge("lanes_paid_spend_usd", "Paid spend today (UTC), reserved and settled.")
        spend.add_metric([], stats.paid_spent_today_usd)
        ceiling = _gauge("lanes_paid_ceiling_usd", "The paid ceiling per UTC day.")
        ceiling.add_metric([], stats.paid_ceiling_usd)
        free = _gauge("lanes_free_lane_on", "1 while borrowed-free capacity is switched on.")
        free.add_metric([], int(stats.free_lane))
        pending = _gauge("lanes_approvals_pending", "Paid fallbacks waiting for a decision.")
        pending.add_metric([], len(stats.approvals))
        store = _gauge(
            "lanes_state_store_up",
            "1 while the state store answers (Redis: and the paid ledger is synchronised).",
            ("kind",),
        )
        store.add_metric([stats.store.kind], int(stats.store.up))
        yield from (spend, ceiling, free, pending, store)
        yield from self._background(stats)

    def _background(self, stats: Statistics) -> Iterator[Metric]:
        """The background tasks (state sync, listener, catalogs, balances): failing now, failures
        so far, and what they dropped rather than retry for ever."""
        tasks = stats.background.tasks
        failing = _gauge("lanes_task_failing", "1 while a background task is failing.", ("task",))
        for task in tasks:
            failing.add_metric([task.name], int(task.failing is not None))
        yield failing
        yield _counter(
            "lanes_task_failures",
            "Failed rounds of a background task.",
            ("task",),
            {(t.name,): t.failures for t in tasks},
        )
        yield _counter(
            "lanes_dropped",
            "Records dropped (poison, or over a bound).",
            ("queue",),
            {(queue,): n for queue, n in stats.background.dropped.items()},
        )


class WorkCollector(Collector):
    """Work that can wait: the batch queue's batches by status and items by state (counted every
    few seconds by its runner), and the interactive jobs waiting for a free quota now."""

    def __init__(
        self, tally: Callable[[], Mapping[str, Mapping[str, int]]], waiting: Callable[[], int]
    ) -> None:
        self._tally, self._waiting = tally, waiting

    def collect(self) -> Iterator[Metric]:
        tally = self._tally()
        batches = _gauge("lanes_batches", "Batches kept, by status.", ("status",))
        held = tally.get("batches", {})
        for status in BATCH_STATUSES:
            batches.add_metric([status], held.get(status, 0))
        items = _gauge(
            "lanes_batch_items",
            "Items of the batches kept, by state (expired and cancelled items are failed).",
            ("state",),
        )
        held = tally.get("items", {})
        for state in ITEM_STATES:
            items.add_metric([state], held.get(state, 0))
        waiting = _gauge(
            "lanes_waiting_jobs", "Interactive jobs waiting for a free quota (X-Lanes-Max-Wait)."
        )
        waiting.add_metric([], self._waiting())
        yield from (batches, items, waiting)


class Metrics:
    """The sidecar's registry: `render()` is one scrape in Prometheus' text format."""

    content_type = CONTENT_TYPE

    def __init__(self, statistics: Callable[[], Statistics], *more: Collector) -> None:
        """`more`: collectors of what `statistics()` does not hold (work that can wait)."""
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(StatisticsCollector(statistics))
        for collector in more:
            self.registry.register(collector)

    def render(self) -> bytes:
        return generate_latest(self.registry)

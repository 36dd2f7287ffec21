"""What every job leaves behind: one audit row (flushed by the state sync), one entry in the list
of recent jobs (for the status page), its share of the running totals (for `/metrics`), and one
log line on `lanes.jobs` — never a body. Rows wait for the store in a bounded queue: when it is
down for long, the oldest are dropped and counted.

Off the reply's path: `finish` keeps one small record of the job's end — its times, the candidate
that served, the request's and the answer's digests (never a body, but for `log_bodies`), its
attempts and skips, the paid spend after it — and the reply leaves.
The audit row, the recent entry and the running totals are built from those records in batches
(`fold`): by the state sync each time it takes the rows (every half second), by any reader of the
recent jobs or the totals before it reads, and at once when `MAX_ENDED` are waiting. No reader
sees a job missing that has finished.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import trio

from lanes._core.audit.tally import Tally
from lanes._core.audit.tracing import JobTrace, job_trace
from lanes._core.config.schema import Config
from lanes._core.engine.catalog import Catalog
from lanes._core.model.candidates import Attempt, Candidate, Skip
from lanes._core.model.clocks import EpochTime
from lanes._core.model.job import digest
from lanes._core.model.record import JobRecord
from lanes._core.policy.ranking import Ranking
from lanes._core.runtime.tasks import TaskHealth
from lanes._core.state.audit import JobFacts, audit_row
from lanes._core.state.cohorts import Cohorts

job_log = logging.getLogger("lanes.jobs")
log = logging.getLogger("lanes")
#: Audit rows waiting for the store (it may be down for hours): at most this many, this large.
MAX_ROWS = 10_000
MAX_BYTES = 32 * 1024 * 1024
#: Finished jobs waiting to be folded into rows, recent entries and totals: at most this many.
MAX_ENDED = 1024


class _Ended(NamedTuple):
    """One job's end as `finish` saw it: what the fold needs, and no body (but for `log_bodies`):
    the job's names and digests, its record's figures."""

    job: JobFacts
    outcome: str
    at: EpochTime
    ended_at: float
    started_at: float
    deadline_s: float
    candidate: Candidate | None
    route: str | None
    usage: Mapping[str, Any] | None
    answer_digest: tuple[str, int]
    answer: Any  # kept only for `log_bodies`: otherwise its digest is all that is needed
    paid_before: float | None
    paid_after: float | None
    attempts: tuple[Attempt, ...]
    skips: tuple[Skip, ...]
    plan: tuple[str, ...]
    request_class: str
    privacy: str
    approval: str
    explored: bool
    streamed: bool
    saved_usd: float  # a cache hit's: what its answer cost when it was made


#: A row's values that may be long (the rest are names, hashes and numbers of bounded size).
_LONG = ("attempt_log", "skip_log", "plan", "dropped", "body")


def _size(row: Mapping[str, Any]) -> int:
    """About what a row holds in memory: its long texts, plus a little per value and attempt."""
    long = sum(len(v) for name in _LONG if isinstance(v := row.get(name), str))
    return long + 96 * len(row) + 256 * len(row.get("attempt_rows") or ())


class Journal:
    def __init__(
        self,
        *,
        config: Config,
        catalog: Catalog,
        ranking: Ranking,
        cohorts: Cohorts,
        spent_today: Callable[[], float],
        now_wall: Callable[[], EpochTime],
        recent: int = 50,
        health: TaskHealth | None = None,
        traces: Callable[[JobTrace], None] | None = None,
    ) -> None:
        """`spent_today`: the ledger's paid spend today; `traces`: where each finished job's
        spans go when telemetry is on (`telemetry.py`)."""
        self._config = config
        self._catalog = catalog
        self._ranking = ranking
        self._cohorts = cohorts
        self._spent_today = spent_today
        self._traces = traces
        self._now_wall = now_wall
        self._health = health
        self._rows: deque[tuple[int, dict[str, Any]]] = deque()  # (size, row) for the state sync
        self._bytes = 0
        self._recent: deque[dict[str, Any]] = deque(maxlen=recent)
        self._tally = Tally(declared=cohorts.declared)  # the running totals /metrics shows
        self._ended: list[_Ended] = []  # finished, not yet folded (see `fold`)

    @property
    def tally(self) -> Tally:
        """The running totals, every finished job counted."""
        self.fold()
        return self._tally

    def take_rows(self) -> list[dict[str, Any]]:
        self.fold()
        rows = [row for _, row in self._rows]
        self._rows, self._bytes = deque(), 0
        return rows

    def return_rows(self, rows: list[dict[str, Any]]) -> int:
        """Rows the store could not take: kept, oldest first, for the next sync — within the
        bounds (`MAX_ROWS`, `MAX_BYTES`), the oldest dropped first. Returns how many were
        dropped."""
        for row in reversed(rows):
            size = _size(row)
            self._rows.appendleft((size, row))
            self._bytes += size
        return self._trim()

    def _trim(self) -> int:
        dropped = 0
        while self._rows and (len(self._rows) > MAX_ROWS or self._bytes > MAX_BYTES):
            size, _ = self._rows.popleft()
            self._bytes -= size
            dropped += 1
        return dropped

    def recent(self) -> tuple[Mapping[str, Any], ...]:
        self.fold()
        return tuple(self._recent)

    def finish(
        self,
        record: JobRecord,
        outcome: str,
        *,
        served: str | None = None,
        answer: Any = None,
        usage: Mapping[str, Any] | None = None,
        route: str | None = None,
        saved_usd: float = 0.0,
    ) -> None:
        """Note that `record`'s job ended; what it leaves behind is built by the next `fold`.
        `served` is the "lane/model" that answered; `route` is `cache` for an answer the response
        cache gave (which saved `saved_usd`), else the served attempt's."""
        job, now_wall = record.job, self._now_wall()
        last = record.attempts[-1] if record.attempts else None
        served_key = served or (last.key if last else None)
        candidate = self._catalog.candidate(served_key) if served_key else None
        if route is None:
            route = next((a.route for a in reversed(record.attempts) if a.key == served_key), None)
        ended_at = trio.current_time()
        if candidate is not None and record.explored == candidate.key and outcome == "ok":
            self._ranking.explored_served()
        paid_after = None if record.paid_before is None else self._spent_today()
        bodies = self._config.log_bodies
        ended = _Ended(
            JobFacts.of(job, keep_body=bodies),
            outcome,
            now_wall,
            ended_at,
            record.started_at,
            record.deadline_at - record.started_at,
            candidate,
            route,
            usage,
            digest(answer) if answer is not None else ("", 0),
            answer if bodies else None,
            record.paid_before,
            paid_after,
            tuple(record.attempts),
            tuple(record.all_skips()),
            tuple(record.plan),
            record.request_class,
            record.privacy,
            record.approval or "",
            candidate is not None and record.explored == candidate.key,
            record.streamed,
            saved_usd,
        )
        if self._traces is not None:
            lanes = self._catalog.lanes
            trace = job_trace(
                record,
                outcome,
                ended_wall=now_wall,
                ended_at=ended_at,
                served=candidate,
                route=route,
                usage=usage,
                provider_of=lambda lane: lanes[lane].spec.provider if lane in lanes else lane,
            )
            self._traces(trace)
        if self._config.log_jobs:
            job_log.info(
                "job %s model=%s route=%s served=%s attempts=%d outcome=%s %.0f ms%s",
                job.id,
                job.model,
                route or "-",
                served_key if outcome == "ok" else "-",
                len(record.attempts),
                outcome,
                (ended_at - record.started_at) * 1000,
                f" dropped={','.join(job.dropped)}" if job.dropped else "",
            )
        self._ended.append(ended)
        if len(self._ended) >= MAX_ENDED:
            self.fold()

    def fold(self) -> None:
        """Build what the finished jobs leave behind: their audit rows, recent entries and their
        share of the running totals."""
        ended, self._ended = self._ended, []
        failed = 0
        for end in ended:
            try:
                self._fold_one(end)
            except Exception as exc:  # one job's row must not cost the others theirs
                failed += 1
                log.error("job %s: its audit row could not be built (%s)", end.job.id, exc)
        if ended and self._health is not None:
            self._health.dropped("audit rows", self._trim() + failed)

    def _fold_one(self, end: _Ended) -> None:
        job, outcome, candidate, route = end.job, end.outcome, end.candidate, end.route
        latency_s = end.ended_at - end.started_at
        cost = sum(a.cost_usd for a in end.attempts)
        lane, model = (candidate.lane, candidate.model) if candidate else ("", "")
        # the row first: should it fail, nothing of this job is counted
        row = audit_row(
            job=job,
            at=end.at,
            request_class=end.request_class,
            outcome=outcome,
            route=route,
            lane=lane or None,
            model=model or None,
            attempts=end.attempts,
            skips=end.skips,
            latency_s=latency_s,
            answer=end.answer,
            answer_digest=end.answer_digest,
            usage=end.usage,
            cost_usd=cost,
            approval=end.approval,
            log_bodies=self._config.log_bodies,
            explored=end.explored,
            privacy=end.privacy,
            served=candidate,
            considered=end.plan,
            paid_before=end.paid_before,
            paid_after=end.paid_after,
            streamed=end.streamed,
            deadline_s=end.deadline_s,
            saved_usd=end.saved_usd,
        )
        self._recent.appendleft(
            {
                "id": job.id,
                "at": end.at,
                "route": route or "",
                "outcome": outcome,
                "lane": lane,
                "model": model,
                "client": job.client,
                "cohort": job.cohort or "",
                "latency_s": round(latency_s, 4),
                "attempts": len(end.attempts),
                "cost_usd": cost,
            }
        )
        self._tally.job(
            route=route,
            lane=lane if outcome == "ok" else "",
            model=model if outcome == "ok" else "",
            outcome=outcome,
            cohort=job.cohort,
            latency_s=latency_s,
            attempts=end.attempts,
            usage=end.usage,
            trusted=self._cohorts.trusted(job.client),
        )
        size = _size(row)
        self._rows.append((size, row))
        self._bytes += size

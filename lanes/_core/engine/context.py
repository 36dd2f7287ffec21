"""What a job's walk consults, each part the owner of what it knows: the catalog (the lanes and
their candidates), the gate (switches, breakers, probes), the lanes' health, the paid gate (consent,
the ledger), the FreeTierManager, the ranking, the sync that tells other processes of a backoff, and
the policy in force. Built once per dispatcher; nothing in it is rebound."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import trio

from lanes._core.engine.catalog import Catalog, LaneHealth
from lanes._core.engine.gate import Gate
from lanes._core.freetier.manager import FreeTierManager
from lanes._core.model.candidates import Candidate
from lanes._core.model.clocks import EpochTime
from lanes._core.model.errors import JobFailed, UnknownModel, Unservable
from lanes._core.model.job import Job
from lanes._core.model.record import JobRecord
from lanes._core.money.paid import PaidGate
from lanes._core.policy.autoplan import AutoPlan
from lanes._core.policy.needs import Needs
from lanes._core.policy.policy import PolicyConfig
from lanes._core.policy.ranking import Ranking


class BackoffNews(Protocol):
    """The state sync, told that a rate limit changed a backoff the other processes must hear of."""

    def backoffs_changed(self) -> None: ...


class Routing:
    def __init__(
        self,
        *,
        catalog: Catalog,
        gate: Gate,
        health: LaneHealth,
        paid: PaidGate,
        manager: FreeTierManager,
        ranking: Ranking,
        sync: BackoffNews,
        policy: Callable[[], PolicyConfig],
        now_wall: Callable[[], EpochTime],
    ) -> None:
        """`policy` is the policy in force (read at every use); `now_wall` the wall source."""
        self.catalog = catalog
        self.gate = gate
        self.health = health
        self.paid = paid
        self.manager = manager
        self.ranking = ranking
        self.sync = sync
        self.policy = policy
        self._wall = now_wall

    def now_wall(self) -> EpochTime:
        """Wall-clock epoch seconds, read from the wall source now."""
        return self._wall()

    def auto_plan(self, job: Job, needs: Needs, keep: Callable[[Candidate], bool]) -> AutoPlan:
        """An `auto` job's plan, drawn lazily (see `pool.py`): each group of alike candidates
        scored once, each candidate with outcomes of its own on its own."""
        now, pool = self.now_wall(), self.catalog.pool
        degraded = self.ranking.degraded()

        def warm() -> dict[str, float]:
            found = [pool.by_key[k] for k in self.ranking.warm() if k in pool.by_key]
            free = [c for c in found if c.tier == "free"]
            return self.ranking.scores(free, needs, now, degraded=degraded)

        def cold(candidate: Candidate) -> float:
            return self.ranking.cold_score(candidate, needs, now, degraded)

        return AutoPlan(pool, job, self.policy(), needs=needs, keep=keep, warm=warm, cold=cold)

    # -- when free capacity returns ---------------------------------------------------------------
    def next_free(self, job: Job) -> tuple[float, str] | None:
        """(wall-clock epoch, "lane/model") of the soonest moment one of the job's free candidates
        reopens."""
        return next_free(self.catalog, self.manager, job, self.now_wall())

    def backoff_wait(self, candidate: Candidate) -> float | None:
        """Seconds until `candidate`'s backoff ends, or None when it is not backed off."""
        now = self.now_wall()
        backoff = self.manager.is_in_backoff(candidate.lane, candidate.model, now)
        return None if backoff is None else backoff.until - now

    def exhausted(self, record: JobRecord) -> JobFailed:
        """The error for a job whose plan ran out, naming every candidate and why."""
        return record.failed(
            now=trio.current_time(), next_free=self.next_free(record.job), now_wall=self.now_wall()
        )


def next_free(
    catalog: Catalog, manager: FreeTierManager, job: Job, now: float
) -> tuple[float, str] | None:
    """(wall-clock epoch, "lane/model") of the soonest moment after `now` one of `job`'s free
    candidates reopens, or None."""
    try:
        free = [(c.lane, c.model) for c in catalog.resolve(job) if c.tier == "free"]
    except (UnknownModel, Unservable):
        return None
    return manager.next_free_at(free, now, job.headroom)

"""The dispatcher: the routing state, and the doors jobs come through (`complete`, `open_stream`).

Each job gets a record and walks its plan (`engine/walk.py`) under one deadline; each attempt is
gated, budgeted, sent and settled in one place (`engine/attempt.py`). Every job leaves one audit
row and one log line. Operations views read `statistics()`; the state sync talks to the
dispatcher through the methods under "the state sync".
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import trio

from lanes._core.audit.journal import Journal
from lanes._core.audit.statistics import ModelStatistics, Statistics, model_statistics, snapshot
from lanes._core.config.schema import Config
from lanes._core.engine.calls import complete_call, embed_call
from lanes._core.engine.context import Routing, open_record
from lanes._core.engine.session import StreamJob, stream_job
from lanes._core.engine.stream import ReplyStream
from lanes._core.engine.walk import Call, walk
from lanes._core.freetier.manager import FreeTierManager
from lanes._core.model.clocks import EpochTime
from lanes._core.model.errors import JobFailed
from lanes._core.model.job import Candidate, Job, Reply
from lanes._core.model.record import JobRecord
from lanes._core.money.approvals import Approvals
from lanes._core.runtime.secrets import request_secrets
from lanes._core.runtime.tasks import SYNC, Background
from lanes._core.runtime.wall import Wall
from lanes._core.state.clock import StoreClock
from lanes._core.state.store import STORE_ERRORS, ApprovalRecord, SQLiteStore, Store
from lanes._core.state.terms import Consent
from lanes._core.upstream.lane import OpenAICompatibleLane
from lanes._core.upstream.loader import Loaded

log = logging.getLogger("lanes")


class Dispatcher:
    """Routes jobs over the loaded lanes. Build it with `open_dispatcher()`."""

    def __init__(
        self,
        *,
        config: Config,
        loaded: Loaded,
        env: Mapping[str, str],
        store: Store | None = None,
        manager: FreeTierManager | None = None,
        wall: Wall | None = None,
    ) -> None:
        self.config = config
        self.store = store or SQLiteStore(":memory:")
        self.wall = wall or Wall()  # the wall source: read at every calendar decision
        self.clock = StoreClock.of(self.wall, self.store, config.policy.clock_tolerance_s)
        self.routing = Routing(
            config=config,
            lanes={lane.name: lane for lane in loaded.lanes},
            store=self.store,
            manager=manager or FreeTierManager(),
            now_wall=self.now_wall,
            free_lane_on=config.free_lane_on(env),
            clock=self.clock,
        )
        self.unavailable = dict(loaded.unavailable)
        self.background = Background()  # the background tasks' health (see open.py)
        # stamped by the store's clock: report windows and days agree across processes
        trusted, health = self.clock.trusted, self.background.task(SYNC)
        self.journal = Journal(self.routing, config=config, now_wall=trusted, health=health)
        self.opened_at = self.now_wall()  # what the model list calls a configured model's `created`

    def now_wall(self) -> EpochTime:
        """Wall-clock epoch seconds, read from the wall source now (see `wall.py`)."""
        return self.wall()

    @property
    def lanes(self) -> Mapping[str, OpenAICompatibleLane]:
        return self.routing.lanes

    @property
    def approvals(self) -> Approvals:
        """Pending paid-fallback approvals: `approvals.decide(id, "once" | "deny" | seconds)`."""
        return self.routing.approvals

    @property
    def free_lane_on(self) -> bool:
        return self.routing.gate.free_lane_on

    def candidates(self) -> Sequence[Candidate]:
        """Every loaded candidate, in config order."""
        return self.routing.candidates()

    def resolve(self, job: Job) -> Sequence[Candidate]:
        """The candidates for `job.model`; raises `UnknownModel` for a name nothing matches."""
        return self.routing.resolve(job)

    def statistics(self) -> Statistics:
        """A frozen snapshot of lanes, breakers, quotas, spend, approvals and recent jobs."""
        self.journal.fold()  # every job finished here counted (its dropped rows too) before reading
        self.routing.catch_up()  # and the host's view: what other processes wrote a moment ago
        return snapshot(
            self.routing,
            store=self.store,
            unavailable=self.unavailable,
            journal=self.journal,
            background=self.background.statistics(),
        )

    def model_statistics(self, key: str) -> ModelStatistics:
        """One candidate's state now ("lane/model"); raises KeyError for an unknown one."""
        candidate = self.routing.candidate(key)
        if candidate is None:
            raise KeyError(f"no candidate {key!r}")
        return model_statistics(self.routing, candidate)

    def paid_spent_today(self) -> float:
        return self.routing.ledger.spent_today()

    # -- the runtime kill switch -------------------------------------------------------------------
    def lane_off(self, name: str) -> None:
        """Switch a lane off here and, through the state store, in every process sharing it."""
        self._switch(name, True)

    def lane_on(self, name: str) -> None:
        self._switch(name, False)

    def _switch(self, name: str, off: bool) -> None:
        if name not in self.routing.lanes:
            raise KeyError(f"no lane named {name!r}; lanes: {', '.join(self.routing.lanes)}")
        switched_off = self.routing.gate.switched_off
        (switched_off.add if off else switched_off.discard)(name)
        try:
            self.store.put_switch(name, off, self.now_wall())
        except STORE_ERRORS as exc:
            log.warning(
                "lane %s: the switch holds in this process only (state store: %s)", name, exc
            )
        self.routing.nudge()
        log.warning("lane %s: switched %s at runtime", name, "off" if off else "on")

    async def set_terms(
        self, *, ceiling_usd: float | None = None, consent: Consent | None = None
    ) -> None:
        """`lanes ceiling set`: the store's terms for every host, over every announcement made
        before (an operator's decision: it may raise the ceiling). Raises a store error."""
        await self.routing.terms.set_by_operator(ceiling_usd=ceiling_usd, consent=consent)

    def canary_probing(self, on: bool) -> None:
        """While on, quarantined models are routed too: the canary probes them so they may pass."""
        self.routing.gate.canary_probing = on

    def is_off(self, name: str) -> bool:
        return name in self.routing.gate.switched_off

    # -- the state sync ----------------------------------------------------------------------------
    def take_audit_rows(self) -> list[dict[str, Any]]:
        return self.journal.take_rows()

    def return_audit_rows(self, rows: list[dict[str, Any]]) -> int:
        """Rows the store could not take, kept for the next sync; returns how many were dropped."""
        return self.journal.return_rows(rows)

    def switches(self) -> frozenset[str]:
        return frozenset(self.routing.gate.switched_off)

    def apply_switch(self, lane: str, off: bool) -> bool:
        """Obey a switch another process wrote; True when it changed anything here."""
        switched_off = self.routing.gate.switched_off
        if off == (lane in switched_off):
            return False
        (switched_off.add if off else switched_off.discard)(lane)
        return True

    def apply_quarantine(self, current: Mapping[str, str]) -> None:
        quarantine = self.routing.gate.quarantine
        quarantine.clear()
        quarantine.update(current)

    def quarantine(self) -> dict[str, str]:
        return dict(self.routing.gate.quarantine)

    def take_approvals(self, records: list[ApprovalRecord]) -> None:
        """The store's approvals: list them, apply decisions made elsewhere to jobs waiting here."""
        self.routing.approvals.take(records)

    def probe_answered(self, scope: str, ok: bool) -> None:
        """Another host's probe of a cold scope answered."""
        if ok:
            self.routing.manager.confirm(scope)
        self.routing.probes.remote_answered(scope)

    # -- the doors ---------------------------------------------------------------------------------
    async def complete(self, job: Job) -> Reply:
        """Serve `job` by the free-first policy, inside its deadline.

        Raises `DeadlineExceeded`, `FreeTierExhausted`, `NoLaneAvailable`, `UpstreamRejected`,
        `PaidBudgetExhausted`, `FallbackNeedsApproval`, `FallbackDenied`, `GovernorExhausted`,
        `UnknownModel`, `Unservable` (no candidate could ever serve it) or `ModelNotFound` (the
        upstreams say the model named does not exist) — every one a `JobFailed` carrying the
        attempts made and the job's id.
        """
        return await self._serve(open_record(job, self.routing), complete_call)

    async def embed(self, job: Job) -> Reply:
        """Embed `job.input` (a job built with `input=`) by the same policy, budgets and audit.

        Only the model the job names is tried — on every lane that offers it, or over an alias's
        candidates, which config declares the same model — never a different one. Raises what
        `complete` raises; the reply's body is the upstream's embeddings `list`."""
        return await self._serve(open_record(job, self.routing, embedding=True), embed_call)

    async def _serve(self, record: JobRecord, call: Call[Reply]) -> Reply:
        with request_secrets(record.job.keys.values()):  # its own keys: out of its log lines
            try:
                async with AsyncExitStack() as keep:
                    reply = await walk(self.routing, record, call, keep)
            except JobFailed as exc:
                self.journal.finish(record, record.attach(exc).code)
                raise
            except trio.Cancelled:
                self.journal.finish(record, "abandoned")  # the caller went away: audited anyway
                raise
            answer = reply.body.get("data" if record.job.embedding else "choices")
            served = f"{reply.lane}/{reply.model}"
            self.journal.finish(record, "ok", served=served, answer=answer, usage=reply.usage)
            return reply

    @asynccontextmanager
    async def open_stream(self, job: Job) -> AsyncIterator[ReplyStream]:
        """Stream `job`: fall back freely until the first chunk, then yield a `ReplyStream`.

        Raises what `complete` raises before the first chunk; `StreamInterrupted` while iterating.
        """
        async with self.stream_job(job) as streamed, streamed.open() as stream:
            yield stream

    @asynccontextmanager
    async def stream_job(self, job: Job) -> AsyncIterator[StreamJob]:
        """A streamed job whose walks — the first, and any resuming a broken answer — share one
        record: one set of attempt budgets, one story, one audit row when it is over. The job's
        own keys are kept out of every log line made meanwhile."""
        record = open_record(job, self.routing, streamed=True)
        with request_secrets(job.keys.values()):
            async with stream_job(self.routing, record, self.journal.finish) as streamed:
                yield streamed

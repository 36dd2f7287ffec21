"""The dispatcher: the one place the routing's parts are built and wired, and the doors jobs come
through (`complete`, `embed`, `open_stream`).

Each job gets a record and walks its plan (`engine/walk.py`) under one deadline; each attempt is
gated, budgeted, sent and ended in one place (`engine/attempt.py`). Every job leaves one audit
row and one log line. Operations views read `statistics()` and the methods under "views"; the
background tasks (`upkeep.py`) start with `start()`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import attrs
import trio

from lanes._core import upkeep
from lanes._core.audit.forecast import PaidDay, Quota
from lanes._core.audit.journal import Journal
from lanes._core.audit.quotas import free_quotas, paid_day
from lanes._core.audit.statistics import (
    ModelStatistics,
    Sources,
    Statistics,
    model_statistics,
    snapshot,
)
from lanes._core.audit.tracing import JobTrace
from lanes._core.batch.library import LibraryBatch, window_of
from lanes._core.cache.cache import ResponseCache, Served
from lanes._core.cache.replay import CachedStream
from lanes._core.cache.rules import Assembler, CachePlan, replayed
from lanes._core.cache.store import Entries, Entry
from lanes._core.config.schema import Config
from lanes._core.engine.backlog import Backlog
from lanes._core.engine.calls import complete_call, embed_call
from lanes._core.engine.catalog import Catalog, LaneHealth
from lanes._core.engine.context import Routing, next_free
from lanes._core.engine.gate import Gate, Switchboard
from lanes._core.engine.probes import Probes
from lanes._core.engine.session import StreamJob, stream_job
from lanes._core.engine.stream import AnswerStream, wants_usage
from lanes._core.engine.waiting import WaitingRoom
from lanes._core.engine.walk import Call, walk
from lanes._core.freetier.manager import FreeTierManager
from lanes._core.freetier.prices import usage_tokens
from lanes._core.model.candidates import Candidate, Reply
from lanes._core.model.clocks import EpochTime, TrioTime
from lanes._core.model.errors import JobFailed
from lanes._core.model.job import Job
from lanes._core.model.record import JobRecord
from lanes._core.money.approvals import PendingApprovals
from lanes._core.money.consent import Consent
from lanes._core.money.ledger import Ledger
from lanes._core.money.paid import PaidGate
from lanes._core.money.terms import PaidTerms
from lanes._core.policy.ranking import Ranking
from lanes._core.runtime.secrets import request_secrets
from lanes._core.runtime.tasks import LISTENER, SYNC, Background
from lanes._core.runtime.wall import Wall
from lanes._core.state.clock import StoreClock
from lanes._core.state.cohorts import Cohorts
from lanes._core.state.store import STORE_ERRORS, Store
from lanes._core.state.sync import Kick, StateSync
from lanes._core.state.terms import ConsentMode
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
        store: Store,
        wall: Wall,
        background: Background,
        traces: Callable[[JobTrace], None] | None = None,
        cache: Entries | None = None,
    ) -> None:
        """Build every part in the order they depend on each other; nothing is patched in after.
        `background` keeps the health of the background tasks; `traces` receives each finished
        job's spans when telemetry is on; `cache` holds the response cache's entries (None: no
        cache, whatever `[cache]` says)."""
        self.config = config
        self.store = store
        self.background = background
        self.clock = StoreClock.of(wall, store, config.policy.clock_tolerance_s)
        self.opened_at = wall()  # what the model list calls a configured model's `created`
        self._wall = wall
        manager = self._manager = FreeTierManager()
        self.catalog = Catalog(
            loaded.lanes,
            aliases=config.aliases,
            alias_patterns=config.alias_patterns,
            register=manager.register,
        )
        self._health = LaneHealth()
        self._switches = Switchboard(free_lane_on=config.free_lane_on(env))
        kick = Kick()
        probes = Probes(store, manager, wall, kick.ring)
        self._ranking = Ranking(config.scoring)
        self._terms = PaidTerms(config.policy, self.clock, store)
        policy = self._terms.policy
        clients = config.server.clients
        self._ledger = Ledger(policy, manager, store, wall, self.clock, clients=clients)
        self.approvals = PendingApprovals(
            store, self.clock.trusted, once_ttl_s=config.policy.once_ttl_s
        )

        def next_free_s(job: Job) -> float | None:
            now = wall()
            found = next_free(self.catalog, manager, job, now)
            return None if found is None else max(0.0, found[0] - now)

        consent = Consent(policy, self.approvals, next_free_s)
        self._cohorts = Cohorts.of(config)
        self._journal = Journal(
            config=config,
            catalog=self.catalog,
            ranking=self._ranking,
            cohorts=self._cohorts,
            spent_today=self._ledger.spent_today,
            now_wall=self.clock.trusted,  # the store's: report windows agree across processes
            health=background.task(SYNC),
            traces=traces,
        )
        self._sync = StateSync(
            manager=manager,
            store=store,
            now_wall=wall,
            rows=self._journal,
            switches=self._switches,
            news=(probes, self.approvals),
            health=(background.task(SYNC), background.task(LISTENER)),
            kick=kick,
            beats=self._terms,
        )
        self._routing = Routing(
            catalog=self.catalog,
            gate=Gate(
                lanes=self.catalog.lanes,
                manager=manager,
                probes=probes,
                now_wall=wall,
                switchboard=self._switches,
                catch_up=self._sync.catch_up,
                room=WaitingRoom(policy),
                backlog=Backlog(self.config.batch.headroom, spare=self.config.batch.spare),
            ),
            health=self._health,
            paid=PaidGate(self._ledger, consent, manager, wall, policy),
            manager=manager,
            ranking=self._ranking,
            sync=self._sync,
            policy=policy,
            now_wall=wall,
        )

        self.cache = (
            None
            if cache is None
            else ResponseCache(
                config.cache,
                config.server.clients,
                cache,
                now_wall=wall,
                health=background.task("cache"),
                inline_reads=not store.shared,
                quarantined=self._switches.why_quarantined,
            )
        )
        self._sources = Sources(
            switches=self._switches,
            approvals=self.approvals,
            ledger=self._ledger,
            terms=self._terms,
            clock=self.clock,
            store=store,
            journal=self._journal,
            unavailable=dict(loaded.unavailable),
            models_per_lane=config.metrics.models_per_lane,
        )

    async def start(self, nursery: trio.Nursery, *, sync_interval_s: float = 0.5) -> None:
        """Take the state store's view, then start the background tasks in `nursery`: the state
        sync (and, for a shared store, its listener), each lane's reachability check, catalog
        refresh and balance poll, and the audit's retention."""
        await self._sync.load(self.now_wall())
        nursery.start_soon(self._sync.run, sync_interval_s)
        if self.store.shared:
            nursery.start_soon(self._sync.listen)
        unavailable = self._sources.unavailable
        nursery.start_soon(
            upkeep.check_lanes,
            self._health,
            list(self.catalog.lanes.values()),
            unavailable,
            upkeep.fixes_for(self.config.lanes, unavailable),
        )
        for lane in self.catalog.lanes.values():
            if lane.config.discover:
                task = self.background.task(f"catalog {lane.name}")
                nursery.start_soon(upkeep.discover, self.catalog, self._health, lane, task)
            if lane.balance_endpoint() is not None:
                task = self.background.task(f"balance {lane.name}")
                nursery.start_soon(upkeep.poll_balance, self._manager, self._wall, lane, task)
        if self.cache is not None:
            nursery.start_soon(self.cache.run)
            nursery.start_soon(self.cache.sweep)
        if self.config.audit_days:
            nursery.start_soon(upkeep.keep_audit, self.store, self.clock, self.config.audit_days)

    def now_wall(self) -> EpochTime:
        """Wall-clock epoch seconds, read from the wall source now (see `wall.py`)."""
        return self._wall()

    @property
    def lanes(self) -> Mapping[str, OpenAICompatibleLane]:
        return self.catalog.lanes

    @property
    def manager(self) -> FreeTierManager:
        """The FreeTierManager, for tests and tools that look into the quotas (views read
        `statistics()`)."""
        return self._manager

    @property
    def waiting(self) -> WaitingRoom:
        """The room where jobs that asked to wait for a free quota wait (work that can wait
        holds back while it is not empty)."""
        return self._routing.gate.room

    @property
    def work_left(self) -> Backlog:
        """How much work that can wait is left (interactive jobs spare what it needs)."""
        return self._routing.gate.work_left

    @property
    def free_lane_on(self) -> bool:
        return self._switches.free_lane_on

    def candidates(self) -> Sequence[Candidate]:
        """Every loaded candidate, in config order."""
        return self.catalog.candidates()

    def resolve(self, job: Job) -> Sequence[Candidate]:
        """The candidates for `job.model`; raises `UnknownModel` for a name nothing matches."""
        return self.catalog.resolve(job)

    # -- views -------------------------------------------------------------------------------------
    def catch_up(self) -> None:
        """Take what other processes on the host wrote a moment ago (switches, backoffs, counts)."""
        self._sync.catch_up()

    def statistics(self) -> Statistics:
        """A frozen snapshot of lanes, breakers, quotas, spend, approvals and recent jobs."""
        self._journal.fold()  # every job finished here counted (its dropped rows too) first
        self._sync.catch_up()  # and the host's view: what other processes wrote a moment ago
        return snapshot(self._routing, self._sources, self.background.statistics())

    def model_statistics(self, key: str) -> ModelStatistics:
        """One candidate's state now ("lane/model"); raises KeyError for an unknown one."""
        candidate = self.catalog.candidate(key)
        if candidate is None:
            raise KeyError(f"no candidate {key!r}")
        return model_statistics(self._routing, self._switches, candidate)

    def refusal(self, candidate: Candidate) -> str | None:
        """Why `candidate` can not be sent anything now (a switch, a hold-back, a breaker)."""
        return self._routing.gate.refusal(candidate)

    def free_quotas(self) -> list[Quota]:
        """Every free quota per day or month, as this process knows it now."""
        return free_quotas(self.catalog, self._manager, self.now_wall())

    def paid_day(
        self, client: str | None = None, *, audited: Callable[[str, float], float] | None = None
    ) -> PaidDay:
        """Today's paid spend against the ceiling in force (see `quotas.paid_day`)."""
        return paid_day(self._ledger, self.store.shared, client, audited=audited)

    def paid_spent_today(self) -> float:
        return self._ledger.spent_today()

    def take_audit_rows(self) -> list[dict[str, Any]]:
        """The audit rows of the jobs finished since the last take (the sync takes them too)."""
        return self._journal.take_rows()

    # -- the runtime kill switch and the canary ----------------------------------------------------
    def lane_off(self, name: str) -> None:
        """Switch a lane off here and, through the state store, in every process sharing it."""
        self._switch(name, True)

    def lane_on(self, name: str) -> None:
        self._switch(name, False)

    def _switch(self, name: str, off: bool) -> None:
        if name not in self.catalog.lanes:
            raise KeyError(f"no lane named {name!r}; lanes: {', '.join(self.catalog.lanes)}")
        self._switches.switch(name, off)
        try:
            self.store.put_switch(name, off, self.now_wall())
        except STORE_ERRORS as exc:
            log.warning(
                "lane %s: the switch holds in this process only (state store: %s)", name, exc
            )
        self._sync.kick()
        log.warning("lane %s: switched %s at runtime", name, "off" if off else "on")

    def is_off(self, name: str) -> bool:
        return self._switches.is_off(name)

    def canary_probing(self, on: bool) -> None:
        """While on, quarantined models are routed too: the canary probes them so they may pass."""
        self._switches.canary_probing(on)

    def quarantine(self, current: Mapping[str, str]) -> None:
        """The canary's quarantine is now `current` (as the sync takes it from the store)."""
        self._switches.quarantine(current)

    async def set_terms(
        self, *, ceiling_usd: float | None = None, consent: ConsentMode | None = None
    ) -> None:
        """`lanes ceiling set`: the store's terms for every host, over every announcement made
        before (an operator's decision: it may raise the ceiling). Raises a store error."""
        await self._terms.set_by_operator(ceiling_usd=ceiling_usd, consent=consent)

    # -- the doors ---------------------------------------------------------------------------------
    async def complete(self, job: Job) -> Reply:
        """Serve `job` by the free-first policy, inside its deadline.

        Raises `DeadlineExceeded`, `FreeTierExhausted`, `NoLaneAvailable`, `UpstreamRejected`,
        `PaidBudgetExhausted`, `FallbackNeedsApproval`, `FallbackDenied`, `GovernorExhausted`,
        `UnknownModel`, `Unservable` (no candidate could ever serve it) or `ModelNotFound` (the
        upstreams say the model named does not exist) — every one a `JobFailed` carrying the
        attempts made and the job's id.
        """
        record = self._open_record(job)
        if self.cache is None:
            return await self._serve(record, complete_call)
        return await self._cached(record, self.cache)

    async def _cached(self, record: JobRecord, cache: ResponseCache) -> Reply:
        """`complete` with the response cache: its answer on a hit, else the walk's (kept when
        the job may write it)."""
        job = record.job
        plan = cache.plan(job)
        key = cache.key(job) if plan.used else ""
        found = await cache.find(job, key) if plan.read else None
        if found is not None:
            return self._hit(record, *found, cache)
        reply = await self._serve(record, complete_call)
        if plan.write:
            served = Served(reply.lane, reply.model, reply.provider, reply.route, reply.cost_usd)
            cache.keep(job, key, {"completion": reply.body}, served, reply.raw)
        if plan.status is not None:
            cache.counted(plan.status)
        return attrs.evolve(reply, cache=plan.status)

    def _hit(
        self, record: JobRecord, entry: Entry, kept: Mapping[str, Any], cache: ResponseCache
    ) -> Reply:
        """A cache hit as the job's reply: the entry's answer (`kept`, parsed) with a fresh id, who
        made it, route `cache`; audited with what it saved."""
        body = replayed(kept["completion"], f"chatcmpl-{record.id}")
        usage = body.get("usage") if isinstance(body.get("usage"), Mapping) else None
        self._journal.finish(
            record,
            "ok",
            served=f"{entry.lane}/{entry.model}",
            answer=body.get("choices"),
            usage=usage,
            route="cache",
            saved_usd=entry.cost_usd,
        )
        cache.counted("hit", tokens=sum(usage_tokens(usage) or ()), saved_usd=entry.cost_usd)
        return Reply(
            body=body,
            lane=entry.lane,
            provider=entry.provider,
            model=entry.model,
            route="cache",
            usage=usage,
            request_id=record.id,
            cache="hit",
            age_s=max(0.0, self.now_wall() - entry.made_at),
        )

    async def embed(self, job: Job) -> Reply:
        """Embed `job.input` (a job built with `input=`) by the same policy, budgets and audit.

        Only the model the job names is tried — on every lane that offers it, or over an alias's
        candidates, which config declares the same model — never a different one. Raises what
        `complete` raises; the reply's body is the upstream's embeddings `list`."""
        return await self._serve(self._open_record(job, embedding=True), embed_call)

    @asynccontextmanager
    async def submit_batch(
        self,
        jobs: Iterable[Job],
        *,
        window: str | float = "24h",
        concurrency: int | None = None,
        max_paid_usd: float = 0.0,
    ) -> AsyncIterator[LibraryBatch]:
        """Work that can wait: serve `jobs` on free capacity as it reopens, within `window`
        (`"24h"`, lanes' `"1h"`..`"7d"`, or seconds), leaving `[batch]` `headroom` of every free
        quota to interactive work; at most `concurrency` (default `[batch]`'s) at once; paying
        only on a budget of its own (`max_paid_usd`), for what free capacity can not serve in the
        window. Yields the batch (`progress`, `results()`, `cancel()`); leaving the block waits
        for it to end. See `batch/library.py`."""
        settings = self.config.batch
        batch = LibraryBatch(
            list(jobs),
            lambda job: self.embed(job) if job.input is not None else self.complete(job),
            window_s=window_of(window),
            headroom=settings.headroom,
            concurrency=concurrency or settings.concurrency,
            interactive_waiting=lambda: self.waiting.waiting,
            backlog=self._routing.gate.work_left,
            max_paid_usd=max_paid_usd,
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(batch.run)
            yield batch

    async def _serve(self, record: JobRecord, call: Call[Reply]) -> Reply:
        with request_secrets(record.job.keys.values()):  # its own keys: out of its log lines
            try:
                async with AsyncExitStack() as keep:
                    reply = await walk(self._routing, record, call, keep)
            except JobFailed as exc:
                self._journal.finish(record, record.attach(exc).code)
                raise
            except trio.Cancelled:
                self._journal.finish(record, "abandoned")  # the caller went away: audited anyway
                raise
            answer = reply.body.get("data" if record.job.embedding else "choices")
            served = f"{reply.lane}/{reply.model}"
            self._journal.finish(record, "ok", served=served, answer=answer, usage=reply.usage)
            return reply

    @asynccontextmanager
    async def open_stream(self, job: Job) -> AsyncIterator[AnswerStream]:
        """Stream `job`: fall back freely until the first chunk, then yield a `ReplyStream` (a
        `CachedStream` when the response cache answers it).

        Raises what `complete` raises before the first chunk; `StreamInterrupted` while iterating.
        """
        async with self.stream_job(job) as streamed, streamed.open() as stream:
            yield stream

    @asynccontextmanager
    async def stream_job(self, job: Job) -> AsyncIterator[StreamJob]:
        """A streamed job whose walks — the first, and any resuming a broken answer — share one
        record: one set of attempt budgets, one story, one audit row when it is over. The job's
        own keys are kept out of every log line made meanwhile."""
        record = self._open_record(job, streamed=True)
        cache, plan, key = self.cache, None, ""
        extra: dict[str, Any] = {}
        if cache is not None:
            plan = cache.plan(job)
            key = cache.key(job) if plan.used else ""
            extra = await self._stream_cache(record, cache, plan, key)
        with request_secrets(job.keys.values()):
            async with stream_job(self._routing, record, self._journal.finish, **extra) as streamed:
                yield streamed
            if cache is not None and plan is not None and plan.write and "hit" not in extra:
                self._keep_streamed(cache, job, key, streamed)

    @staticmethod
    def _keep_streamed(cache: ResponseCache, job: Job, key: str, streamed: StreamJob) -> None:
        """A streamed answer kept in the cache, when it was whole (see `whole_answer`)."""
        whole = streamed.whole_answer()
        if whole is not None:
            body, stream = whole
            served = Served(
                stream.lane, stream.model, stream.provider, stream.route, stream.job_cost_usd
            )
            cache.keep(job, key, body, served)

    async def _stream_cache(
        self, record: JobRecord, cache: ResponseCache, plan: CachePlan, key: str
    ) -> dict[str, Any]:
        """What a streamed job takes from the cache: its hit, or what a fresh answer says of the
        cache and where it is put together to be kept."""
        job = record.job
        found = await cache.find(job, key) if plan.read else None
        hit = None if found is None else self._replay(record, *found, cache)
        if hit is None:
            if plan.status is not None:
                cache.counted(plan.status)
            limit = cache.config.max_entry_kb * 1024
            return {"cache": plan.status, "keep": Assembler(limit) if plan.write else None}
        usage = hit.usage
        cache.counted("hit", tokens=sum(usage_tokens(usage) or ()), saved_usd=hit.saved_usd)
        return {"hit": hit}

    def _replay(
        self, record: JobRecord, entry: Entry, kept: dict[str, Any], cache: ResponseCache
    ) -> CachedStream | None:
        """A hit as a stream; None (a miss, said) when a chunk the entry kept can not be read."""
        try:
            return CachedStream(
                entry,
                kept,
                request_id=record.id,
                deadline_at=record.deadline_at,
                usage=wants_usage(record.job),
                age_s=max(0.0, self.now_wall() - entry.made_at),
            )
        except ValueError as exc:
            cache.unreadable(exc)
            return None

    def _open_record(
        self, job: Job, *, embedding: bool = False, streamed: bool = False
    ) -> JobRecord:
        """A job's record as it enters a door: its deadline fixed now, the client's default cohort
        when the job names none, and its cohort within the client's bound (see `cohorts.py`).
        Raises ValueError for a job at the wrong door."""
        if job.embedding != embedding:
            raise ValueError("a job with input goes to embed(); one with messages, not there")
        config = self.config
        now = TrioTime(trio.current_time())
        deadline_at = job.resolve_deadline(now, config.default_deadline_s)
        own = config.server.clients.get(job.client)
        cohort = job.cohort if job.cohort is not None or own is None else own.cohort
        counted, bitten = self._cohorts.admit(job.client, cohort)
        if bitten:
            log.warning(
                "client %s: its jobs named more than %d cohorts not declared; later new ones count "
                'as "other" (declare them in [metrics] cohorts, or raise [metrics] '
                "cohorts_per_client)",
                job.client,
                config.metrics.cohorts_per_client,
            )
        if counted != job.cohort:
            job = attrs.evolve(job, cohort=counted)
        return JobRecord(job, deadline_at=deadline_at, started_at=now, streamed=streamed)

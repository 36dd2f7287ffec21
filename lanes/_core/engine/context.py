"""Everything a job's walk consults: the lanes and their candidates, the gate, the breakers, the
paid gate (ledger, consent), the ranking and the FreeTierManager — built once per dispatcher."""

from __future__ import annotations

import contextlib
import fnmatch
import logging
from collections.abc import Callable, Mapping, Sequence

import attrs
import trio

from lanes._core.config.schema import Config
from lanes._core.engine.gate import Gate
from lanes._core.engine.probes import Probes
from lanes._core.freetier.manager import FreeTierManager, LaneTerms
from lanes._core.model.clocks import EpochTime, TrioTime
from lanes._core.model.errors import JobFailed, UnknownModel, Unservable, UpstreamError
from lanes._core.model.job import Candidate, Job
from lanes._core.model.record import JobRecord
from lanes._core.money.approvals import Approvals
from lanes._core.money.consent import Consent
from lanes._core.money.ledger import Ledger
from lanes._core.money.paid import PaidGate
from lanes._core.money.terms import SharedTerms
from lanes._core.policy.autoplan import AutoPlan
from lanes._core.policy.breakers import LaneBreakers
from lanes._core.policy.needs import Needs
from lanes._core.policy.policy import PolicyConfig
from lanes._core.policy.pool import Pool
from lanes._core.policy.ranking import Ranking
from lanes._core.policy.verdicts import wrong_kind
from lanes._core.state.clock import StoreClock
from lanes._core.state.cohorts import Cohorts
from lanes._core.state.store import STORE_ERRORS, Store
from lanes._core.upstream.lane import OpenAICompatibleLane

log = logging.getLogger("lanes")


class Routing:
    def __init__(
        self,
        *,
        config: Config,
        lanes: Mapping[str, OpenAICompatibleLane],
        store: Store,
        manager: FreeTierManager,
        now_wall: Callable[[], EpochTime],
        free_lane_on: bool,
        clock: StoreClock,
    ) -> None:
        self.config = config
        self.policy = config.policy  # as configured, then as the store's terms govern it
        self.lanes = dict(lanes)
        self.manager = manager
        self.now_wall = now_wall  # wall-clock epoch seconds, read from the wall source
        self.clock = clock  # the store's clock: the ledger's day and every expiry
        self.store_shared = store.shared
        self._kick: Callable[[], None] = lambda: None  # the state sync's, once it starts
        self._catch_up: Callable[[], None] = lambda: None
        self._store = store
        self.breakers = {
            name: LaneBreakers(lane.config.breaker) for name, lane in self.lanes.items()
        }
        self.probes = Probes(store, manager, now_wall, self.nudge)
        self.gate = Gate(
            lanes=self.lanes,
            breakers=self.breakers,
            manager=manager,
            probes=self.probes,
            now_wall=now_wall,
            free_lane_on=free_lane_on,
            catch_up=self.catch_up,
        )
        self.ledger = Ledger(
            self.policy, manager, store, now_wall, self.clock, clients=config.server.clients
        )
        self.approvals = Approvals(store, self.clock.trusted, once_ttl_s=self.policy.once_ttl_s)
        self.consent = Consent(self.policy, self.approvals, self.seconds_to_next_free)
        self.paid = PaidGate(self.ledger, self.consent, manager, now_wall)  # the money door
        self.terms = SharedTerms(config.policy, self.clock, store, self.govern)
        self.ranking = Ranking(config.scoring)
        self.cohorts = Cohorts.of(config)
        # lanes that accepted no connection at startup (until they answer)
        self.unreachable: dict[str, str] = {}
        self.refresh_requested: dict[str, trio.Event] = {}  # lane → wake its catalog refresh early
        for lane in self.lanes.values():
            self.register_prices(lane)
        self.pool = Pool(self._loaded(), config.aliases)  # rebuilt when a catalog changes

    def govern(self, policy: PolicyConfig) -> None:
        """Route by `policy` from now on (the store's terms govern the ceiling and consent)."""
        self.policy = self.ledger.policy = self.consent.policy = policy

    def attach_sync(self, kick: Callable[[], None], catch_up: Callable[[], None]) -> None:
        """The state sync, started: `kick` runs it now, `catch_up` takes what other processes on
        the host wrote since the last look. Until then both do nothing (no sync: no store)."""
        self._kick, self._catch_up = kick, catch_up

    def nudge(self) -> None:
        """Run the state sync now (a probe's answer or a backoff others are waiting for)."""
        self._kick()

    def catch_up(self) -> None:
        """Take what other processes on the host wrote a moment ago (switches, backoffs)."""
        self._catch_up()

    def backoffs_changed(self) -> None:
        """A rate limit changed a backoff: the other processes must see it before their next
        attempt. A store on this host (SQLite) takes it now, inline; a shared one (Redis) with the
        sync, run now."""
        changed = self.manager.changed_backoffs()
        if not changed:
            return
        if self._store.limiter is None:
            # on failure the sync writes it (and reports the store) at its next round
            with contextlib.suppress(*STORE_ERRORS):
                self._store.put_backoffs(dict(changed), self.now_wall())
        elif self.store_shared:
            self.nudge()

    # -- candidates -------------------------------------------------------------------------------
    def _loaded(self) -> list[Candidate]:
        return [c for lane in self.lanes.values() for c in lane.candidates]

    def candidates(self) -> Sequence[Candidate]:
        """Every loaded candidate, in config order."""
        return self.pool.candidates

    def resolve(self, job: Job) -> Sequence[Candidate]:
        """The candidates for `job.model` — `auto`, an alias, `lane/model` or a bare model id — of
        the job's kind: embedding models for an embedding job, the others for a chat. A name with
        a date suffix (`name-20250514`) not known as such resolves to the alias `name`.

        An embedding job must name its model (`auto` would mix models whose vectors do not
        compare); an alias is how config declares the same model on several lanes.
        Raises `UnknownModel`, or `Unservable` for a model of the other kind."""
        pool = self.pool
        if job.model == "auto":
            if job.embedding:
                raise Unservable(
                    "an embedding needs a named model: 'auto' could mix models whose vectors are "
                    "not comparable; name the model, a lane/model or an alias",
                    param="model",
                )
            return pool.chat
        alias = self.alias_of(job.model)
        found: Sequence[Candidate]
        if alias is not None:
            found = pool.aliases.get(alias, ())
        elif job.model in pool.by_key:
            found = (pool.by_key[job.model],)
        else:
            found = pool.by_model.get(job.model, ())
            if not found:
                raise UnknownModel(
                    f"model {job.model!r} is not 'auto', an alias or a configured model"
                )
        fitting = [c for c in found if c.embedding == job.embedding]
        if found and not fitting:
            raise Unservable(wrong_kind(job.model, job.embedding), param="model")
        return fitting

    def alias_of(self, name: str) -> str | None:
        """The alias `name` stands for: itself; else, when `name` is no model's id, the alias it
        is without a date suffix (`-YYYYMMDD`), or the alias of the first of `alias_patterns`
        it matches (a glob, case-sensitive: `claude-*haiku*`) — so next month's model name is
        not a 404."""
        aliases = self.config.aliases
        if name in aliases:
            return name
        base, dash, date = name.rpartition("-")
        dated = dash and len(date) == 8 and date.isdigit() and base in aliases
        if not (dated or self.config.alias_patterns):
            return None
        if name in self.pool.by_model or name in self.pool.by_key:
            return None  # an exact model id wins
        if dated:
            return base
        for pattern, alias in self.config.alias_patterns.items():
            if fnmatch.fnmatchcase(name, pattern):
                return alias if alias in aliases else None
        return None

    def candidate(self, key: str) -> Candidate | None:
        return self.pool.by_key.get(key)

    def auto_plan(self, job: Job, needs: Needs, keep: Callable[[Candidate], bool]) -> AutoPlan:
        """An `auto` job's plan, drawn lazily (see `pool.py`): each group of alike candidates
        scored once, each candidate with outcomes of its own on its own."""
        now, pool = self.now_wall(), self.pool
        degraded = self.ranking.degraded()

        def warm() -> dict[str, float]:
            found = [pool.by_key[k] for k in self.ranking.warm() if k in pool.by_key]
            free = [c for c in found if c.tier == "free"]
            return self.ranking.scores(free, needs, now, degraded=degraded)

        def cold(candidate: Candidate) -> float:
            return self.ranking.cold_score(candidate, needs, now, degraded)

        return AutoPlan(pool, job, self.policy, needs=needs, keep=keep, warm=warm, cold=cold)

    # -- catalogs ---------------------------------------------------------------------------------
    def discovering(self) -> list[OpenAICompatibleLane]:
        return [lane for lane in self.lanes.values() if lane.config.discover]

    async def refresh_catalogs(self, until: float) -> bool:
        """Fetch every discovering lane's catalog now (bounded by `until`); True if any answered."""
        answered = []

        async def one(lane: OpenAICompatibleLane) -> None:
            try:
                await lane.refresh_catalog()
            except UpstreamError as exc:
                log.info("lane %s: catalog refresh failed (%s)", lane.name, exc)
                return
            self.catalog_changed(lane)
            answered.append(lane.name)

        with trio.move_on_at(until):
            async with trio.open_nursery() as nursery:
                for lane in self.discovering():
                    nursery.start_soon(one, lane)
        return bool(answered)

    def catalog_changed(self, lane: OpenAICompatibleLane) -> None:
        """`lane`'s candidates changed (its catalog was fetched): its prices, and the pool."""
        self.register_prices(lane)
        self.pool = Pool(self._loaded(), self.config.aliases)

    def register_prices(self, lane: OpenAICompatibleLane) -> None:
        prices = {
            m.id: (m.input_usd_per_mtok or 0.0, m.output_usd_per_mtok or 0.0)
            for m in lane.models.values()
        }
        declared = {m.id: m.free for m in lane.models.values() if m.free is not None}
        terms = LaneTerms(
            kind=lane.free_tier,
            conventions=lane.provider.conventions,
            prices=prices,
            declared=declared,
        )
        self.manager.register(lane.name, terms)

    # -- when free capacity returns ---------------------------------------------------------------
    def next_free(self, job: Job) -> tuple[float, str] | None:
        """(wall-clock epoch, "lane/model") of the soonest moment one of the job's free candidates
        reopens."""
        try:
            free = [(c.lane, c.model) for c in self.resolve(job) if c.tier == "free"]
        except (UnknownModel, Unservable):
            return None
        return self.manager.next_free_at(free, self.now_wall())

    def seconds_to_next_free(self, job: Job) -> float | None:
        nxt = self.next_free(job)
        return None if nxt is None else max(0.0, nxt[0] - self.now_wall())

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


def open_record(
    job: Job, routing: Routing, *, embedding: bool = False, streamed: bool = False
) -> JobRecord:
    """A job's record as it enters a door: its deadline fixed now, the client's default cohort
    when the job names none, and its cohort within the client's bound (see `cohorts.py`).
    Raises ValueError for a job at the wrong door."""
    if job.embedding != embedding:
        raise ValueError("a job with input goes to embed(); one with messages, not there")
    config = routing.config
    now = TrioTime(trio.current_time())
    deadline_at = job.resolve_deadline(now, config.default_deadline_s)
    own = config.server.clients.get(job.client)
    cohort = job.cohort if job.cohort is not None or own is None else own.cohort
    counted, bitten = routing.cohorts.admit(job.client, cohort)
    if bitten:
        log.warning(
            "client %s: its jobs named more than %d cohorts not declared; later new ones count as "
            '"other" (declare them in [metrics] cohorts, or raise [metrics] cohorts_per_client)',
            job.client,
            config.metrics.cohorts_per_client,
        )
    if counted != job.cohort:
        job = attrs.evolve(job, cohort=counted)
    return JobRecord(job, deadline_at=deadline_at, started_at=now, streamed=streamed)

"""The dispatcher: owns the lanes, their breakers and the shared free-tier state, and serves jobs.

Each job walks its plan (see `route.py`) under one deadline. Before each attempt: kill switch?
breaker open? backed off or used up? too little time left? — then skip, sending nothing. Each
attempt runs under `move_on_at(min(job deadline, now + the lane's cap))`. A fault counts against
the lane's breaker; a final error (400/401/403/413/422) ends the walk; the job's own deadline
firing is never counted against anyone. Every job leaves one audit record.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import trio

from lanes._core.routing import walk as route
from lanes._core.routing.consent import Approvals
from lanes._core.state.audit import audit_row
from lanes._core.routing.breaker import Breaker, Permit
from lanes._core.config import Config
from lanes._core.errors import (
    AttemptTimedOut,
    CreditExhausted,
    FinalError,
    JobFailed,
    ModelGone,
    RateLimited,
    UnknownModel,
    UpstreamError,
    UpstreamRejected,
)
from lanes._core.routing.ledger import Governors
from lanes._core.job import Candidate, Job, Outcome, Reply, cost_usd, route_for
from lanes._core.upstream.lane import OpenAICompatibleLane
from lanes._core.upstream.loader import Loaded
from lanes._core.routing.probes import Probes
from lanes._core.routing.ranking import Ranking
from lanes._core.state.store import STORE_ERRORS, SQLiteStore, Store
from lanes._core.streaming.stream import ReplyStream, first_chunks
from lanes._core.routing.record import Walk
from lanes.freetier.manager import FreeTierManager, LaneTerms

log = logging.getLogger("lanes")


class Dispatcher:
    """Routes jobs over the loaded lanes. Build it with `open_dispatcher()`."""

    def __init__(self, *, config: Config, loaded: Loaded, env: Mapping[str, str], store: Store | None = None,
                 manager: FreeTierManager | None = None, wall_offset: float = 0.0) -> None:
        self.config = config
        self.policy = config.policy
        self.manager = manager or FreeTierManager()
        self.store = store or SQLiteStore(":memory:")
        self.wall_offset = wall_offset  # wall-clock epoch = trio clock + this (taken once, at open)
        self.governors = Governors(self.policy, self.manager, self.store, self.now_wall)
        self.approvals = Approvals(self.store, self.now_wall)
        self.audit_rows: list[dict[str, Any]] = []  # flushed to the store with the other shared state
        self.recent: deque[dict[str, Any]] = deque(maxlen=50)  # the last jobs, for the status page
        self.quarantine: dict[str, str] = {}  # "lane/model" → why the canary took it out of routing
        self.ranking = Ranking(config.scoring)
        self.refresh_requested: dict[str, trio.Event] = {}  # lane → wake its catalog refresh early
        self.unreachable: dict[str, str] = {}  # lanes that did not accept a connection at startup (until they answer)
        self.probing_canary = False  # the canary probes quarantined models so they can pass again
        self.nudge: Callable[[], None] = lambda: None  # ask the state sync to run now (set by open_dispatcher)
        self.probes = Probes(self.store, self.manager, self.now_wall, lambda: self.nudge())
        self.lanes: dict[str, OpenAICompatibleLane] = {lane.name: lane for lane in loaded.lanes}
        self.unavailable = dict(loaded.unavailable)
        self.breakers = {name: Breaker(lane.config.breaker) for name, lane in self.lanes.items()}
        self.free_lane_on = config.free_lane_on(env)
        self.switched_off: set[str] = set()
        for lane in loaded.lanes:
            self.register_prices(lane)

    def now_wall(self) -> float:
        """Wall-clock epoch seconds, derived from trio's clock (one clock; converted at the edge)."""
        return trio.current_time() + self.wall_offset

    # -- the runtime kill switch -------------------------------------------------------------
    def lane_off(self, name: str) -> None:
        """Switch a lane off here and, through the state store, in every process sharing it."""
        self._switch(name, True)

    def lane_on(self, name: str) -> None:
        self._switch(name, False)

    def _switch(self, name: str, off: bool) -> None:
        self._known(name)
        (self.switched_off.add if off else self.switched_off.discard)(name)
        try:
            self.store.put_switch(name, off, self.now_wall())
        except STORE_ERRORS as exc:
            log.warning("lane %s: the switch holds in this process only (state store: %s)", name, exc)
        self.nudge()
        log.warning("lane %s: switched %s at runtime", name, "off" if off else "on")

    def _known(self, name: str) -> None:
        if name not in self.lanes:
            raise KeyError(f"no lane named {name!r}; lanes: {', '.join(self.lanes) or 'none'}")

    # -- candidates ----------------------------------------------------------------------------
    def candidates(self) -> list[Candidate]:
        """Every loaded candidate, in config order."""
        return [c for lane in self.lanes.values() for c in lane.candidates]

    def resolve(self, job: Job) -> list[Candidate]:
        """The candidates for `job.model`: `auto`, an alias, `lane/model` or a bare model id."""
        everything = self.candidates()
        if job.model == "auto":
            return everything
        by_key = {c.key: c for c in everything}
        if job.model in self.config.aliases:
            return [by_key[k] for k in self.config.aliases[job.model] if k in by_key]
        if job.model in by_key:
            return [by_key[job.model]]
        matching = [c for c in everything if c.model == job.model]
        if not matching:
            raise UnknownModel(f"model {job.model!r} is not 'auto', an alias or a configured model")
        return matching

    # -- gating before each attempt ------------------------------------------------------------
    async def admit(self, candidate: Candidate, walk: Walk) -> tuple[Permit, str | None] | None:
        """A breaker permit (and the probe scope held, if any) for one attempt, or None after
        recording why the candidate is skipped. Waits while another job probes a cold candidate."""
        lane = self.lanes[candidate.lane]
        if candidate.tier == "free" and not self.free_lane_on:
            walk.skip(candidate, "free lane off (FREE_LANE=off)")
            return None
        if candidate.lane in self.switched_off:
            walk.skip(candidate, "lane switched off")
            return None
        probe = None
        while True:
            if walk.deadline_at - trio.current_time() < max(lane.config.min_useful_s, 1e-9):
                walk.short_of_time = True
                walk.skip(candidate, "too little time left")
                return None
            reason = self.held_back(candidate)
            if reason is not None:
                if candidate.tier == "free":
                    walk.free_blocked.append(candidate)
                walk.skip(candidate, reason)
                return None
            if candidate.tier != "free" or not self.manager.needs_probe(candidate.lane, candidate.model):
                break
            scope = self.manager.scope(candidate.lane, candidate.model)
            claimed = await self.probes.claim(scope, lane, walk)
            if claimed:
                probe = scope
                break
            if claimed is None:
                walk.skip(candidate, "another job is probing it")
                return None
        permit = self.breakers[candidate.lane].acquire(trio.current_time())
        if permit is None:
            self.probes.release(probe)
            walk.skip(candidate, "breaker open")
            return None
        return permit, probe

    def held_back(self, candidate: Candidate) -> str | None:
        """Why the FreeTierManager holds `candidate` back now (backoff, quota, credits), or None."""
        if candidate.tier == "local":
            return None
        now = self.now_wall()
        if candidate.tier == "free":
            if candidate.key in self.quarantine and not self.probing_canary:
                return self.quarantine[candidate.key]
            verdict = self.manager.classify(candidate.lane, candidate.model, now)
            return None if verdict.free else verdict.reason
        backoff = self.manager.is_in_backoff(candidate.lane, candidate.model, now)
        return None if backoff is None else f"backoff ({backoff.reason}, {backoff.source})"

    def free_now(self, candidate: Candidate) -> bool:
        if candidate.tier == "free" and not self.free_lane_on or candidate.lane in self.switched_off:
            return False
        return self.held_back(candidate) is None and self.breakers[candidate.lane].state(trio.current_time()) != "open"

    def backoff_wait(self, candidate: Candidate) -> float | None:
        """Seconds until `candidate`'s backoff ends, or None when it is not backed off."""
        now = self.now_wall()
        backoff = self.manager.is_in_backoff(candidate.lane, candidate.model, now)
        return None if backoff is None else backoff.until - now

    # -- after each attempt -------------------------------------------------------------------
    def count_request(self, candidate: Candidate) -> None:
        self.manager.record_usage(candidate.lane, candidate.model, now=self.now_wall(), requests=1)

    def record_response(self, candidate: Candidate, headers: Mapping[str, str], status: int,
                        usage: Mapping[str, Any] | None) -> None:
        now = self.now_wall()
        self.unreachable.pop(candidate.lane, None)
        self.manager.update_from_headers(candidate.lane, candidate.model, headers, status=status, now=now)
        self.manager.record_usage(candidate.lane, candidate.model, now=now, requests=0, usage=usage)

    def _record_error(self, candidate: Candidate, exc: UpstreamError) -> None:
        now = self.now_wall()
        reason = {RateLimited: "rate_limited", CreditExhausted: "credit_exhausted", ModelGone: "model_gone"}.get(type(exc))
        if isinstance(exc, ModelGone) and (event := self.refresh_requested.get(candidate.lane)) is not None:
            event.set()  # the model may have left the catalog: fetch it again now
        if reason is not None:
            self.manager.record_rate_limit_error(candidate.lane, candidate.model, reason, headers=exc.headers,
                                                 status=exc.status, body=exc.body, now=now)
            if self.store.shared and self.manager.changed_backoffs:
                self.nudge()  # other hosts hear of it now, not at the next tick

    def settle(self, candidate: Candidate, permit: Permit, outcome: Outcome) -> None:
        breaker = self.breakers[candidate.lane]
        now = trio.current_time()
        if outcome == "fault":
            breaker.record(permit, "fault", now)
        elif outcome in ("ok", "final", "context_length", "model_gone"):
            breaker.record(permit, "success", now)  # the upstream answered sanely
        else:
            breaker.release(permit)  # rate limits, credits, our deadline: proves nothing

    def failed_attempt(self, walk: Walk, candidate: Candidate, permit: Permit, started: float,
                       exc: UpstreamError) -> None:
        outcome = exc.outcome
        if isinstance(exc, AttemptTimedOut) and trio.current_time() >= walk.deadline_at:
            outcome = "deadline"
        self.settle(candidate, permit, outcome)
        self._record_error(candidate, exc)
        walk.record(candidate, outcome, started, status=exc.status, detail=str(exc))
        self.ranking.note(candidate, outcome, trio.current_time() - started, self.now_wall())
        if outcome != "deadline":
            log.info("lane %s: %s %s — %s", candidate.lane, candidate.model, outcome, exc)
        if isinstance(exc, FinalError):
            raise UpstreamRejected(
                f"{candidate.key} rejected the request: {exc}",
                status=exc.status or 400,
                upstream_code=exc.code,
                attempts=walk.attempts,
                skips=walk.skips,
            ) from exc

    def discovering(self) -> list[OpenAICompatibleLane]:
        return [lane for lane in self.lanes.values() if lane.config.discover]

    async def refresh_catalogs(self, until: float) -> bool:
        """Fetch every discovering lane's catalog now (bounded by `until`); True if any answered."""
        answered = []

        async def one(lane: OpenAICompatibleLane) -> None:
            try:
                await lane.refresh_catalog()
                self.register_prices(lane)
                answered.append(lane.name)
            except UpstreamError as exc:
                log.info("lane %s: catalog refresh failed (%s)", lane.name, exc)

        with trio.move_on_at(until):
            async with trio.open_nursery() as nursery:
                for lane in self.discovering():
                    nursery.start_soon(one, lane)
        return bool(answered)

    def register_prices(self, lane: OpenAICompatibleLane) -> None:
        prices = {m.id: (m.input_usd_per_mtok or 0.0, m.output_usd_per_mtok or 0.0) for m in lane.models.values()}
        self.manager.register(lane.name, LaneTerms(kind=lane.free_tier, conventions=lane.provider.conventions,
                                                   prices=prices))

    def seconds_to_next_free(self, walk: Walk) -> float | None:
        now = self.now_wall()
        nxt = self.manager.next_free_at([(c.lane, c.model) for c in self.resolve(walk.job) if c.tier == "free"], now)
        return None if nxt is None else max(0.0, nxt[0] - now)

    def exhausted(self, walk: Walk) -> Exception:
        now = self.now_wall()
        free = [(c.lane, c.model) for c in self.resolve(walk.job) if c.tier == "free"]
        return walk.failed(self.manager.next_free_at(free, now), now)

    def audit(self, walk: Walk, *, outcome: str, candidate: Candidate | None = None, answer: Any = None,
              usage: Mapping[str, Any] | None = None, cost: float = 0.0) -> None:
        last = walk.attempts[-1] if walk.attempts else None
        served = candidate or (None if last is None else next(
            (c for c in self.candidates() if c.lane == last.lane and c.model == last.model), None))
        route_name = None if served is None else route_for(
            served.tier, walk.free_attempts - (served.tier == "free" and bool(walk.attempts)))
        self.recent.appendleft({"at": self.now_wall(), "route": route_name or "", "outcome": outcome,
                                "lane": served.lane if served else "", "attempts": len(walk.attempts),
                                "cost_usd": cost})
        self.audit_rows.append(audit_row(
            job=walk.job, at=self.now_wall(), request_class=walk.request_class, outcome=outcome, route=route_name,
            lane=served.lane if served else None, model=served.model if served else None,
            attempts=walk.attempts, skips=walk.skips, latency_s=trio.current_time() - walk.started_at, answer=answer, usage=usage,
            cost_usd=cost, approval=walk.approval or "", log_bodies=self.config.log_bodies,
            explored=served is not None and walk.explored == served.key))
        if served is not None and walk.explored == served.key and outcome == "ok":
            self.ranking.explored_ok += 1

    # -- the doors -------------------------------------------------------------------------
    def _walk(self, job: Job) -> Walk:
        return Walk(job, job.resolve_deadline(trio.current_time(), self.config.default_deadline_s))

    async def complete(self, job: Job) -> Reply:
        """Serve `job` by the free-first policy, inside its deadline.

        Raises `DeadlineExceeded`, `FreeTierExhausted`, `NoLaneAvailable`, `UpstreamRejected`,
        `PaidBudgetExhausted`, `FallbackNeedsApproval`, `FallbackDenied`, `GovernorExhausted` or
        `UnknownModel` — every one a `JobFailed` carrying the attempts made.
        """

        async def attempt(t: route.Try, walk: Walk) -> Reply:
            c, lane = t.candidate, self.lanes[t.candidate.lane]
            with trio.move_on_at(min(walk.deadline_at, t.started + lane.config.attempt_timeout_s)):
                response = await lane.complete(t.job, c.model)
                self.settle(c, t.permit, "ok")
                path = route_for(c.tier, walk.free_attempts)  # before this attempt counts
                walk.record(c, "ok", t.started, status=response.status)
                self.ranking.note(c, "ok", trio.current_time() - t.started, self.now_wall())
                self.ranking.remember(walk.job, c.key, self.now_wall())
                usage = response.body.get("usage") if isinstance(response.body.get("usage"), Mapping) else None
                cost = cost_usd(c, usage)
                t.settle_paid(cost if usage else None)
                self.record_response(c, response.headers, response.status, usage)
                return Reply(body=response.body, lane=c.lane, provider=lane.provider.name, model=c.model,
                             route=path, attempts=tuple(walk.attempts), skips=tuple(walk.skips), cost_usd=cost,
                             usage=usage, explored=walk.explored == c.key, raw=response.raw)
            raise _timed_out(lane)

        walk = self._walk(job)
        try:
            reply = await route.run(self, walk, attempt)
        except JobFailed as exc:
            self.audit(walk, outcome=exc.code)
            raise
        candidate = next(c for c in self.candidates() if c.lane == reply.lane and c.model == reply.model)
        self.audit(walk, outcome="ok", candidate=candidate, answer=reply.body.get("choices"), usage=reply.usage,
                   cost=reply.cost_usd)
        return reply

    @asynccontextmanager
    async def open_stream(self, job: Job, *, exclude: frozenset[str] = frozenset(),
                          require_prefill: bool = False) -> AsyncIterator[ReplyStream]:
        """Stream `job`: fall back freely until the first chunk, then yield a `ReplyStream`.

        Raises what `complete` raises before the first chunk; `StreamInterrupted` while iterating.
        `exclude` and `require_prefill` narrow the candidates (used to resume a broken stream).
        """
        async with AsyncExitStack() as outer:

            async def attempt(t: route.Try, walk: Walk) -> ReplyStream:
                c, lane = t.candidate, self.lanes[t.candidate.lane]
                async with AsyncExitStack() as stack:
                    with trio.move_on_at(min(walk.deadline_at, t.started + lane.config.first_token_s)):
                        reader = await stack.enter_async_context(lane.open_stream(t.job, c.model))
                        buffered = await first_chunks(reader)
                        self.record_response(c, reader.headers, 200, None)

                        def finish(outcome: Outcome) -> None:
                            self.settle(c, t.permit, outcome)
                            t.settle_paid(cost_usd(c, reader.usage) if reader.usage else None)
                            self.ranking.note(c, outcome, trio.current_time() - t.started, self.now_wall())
                            if outcome == "ok":
                                self.ranking.remember(walk.job, c.key, self.now_wall())

                        stream = ReplyStream(reader=reader, buffered=buffered, candidate=c,
                                             provider=lane.provider.name,
                                             route=route_for(c.tier, walk.free_attempts), walk=walk,
                                             started_at=t.started, idle_s=lane.config.idle_s, settle=finish)
                        outer.push_async_exit(stack.pop_all())
                        return stream
                raise _timed_out(lane, first=True)

            walk = self._walk(job)
            try:
                stream = await route.run(self, walk, attempt, exclude=exclude, require_prefill=require_prefill)
            except JobFailed as exc:
                self.audit(walk, outcome=exc.code)
                raise
            try:
                yield stream
            finally:
                stream.close()
                if stream.usage:
                    self.manager.record_usage(stream.lane, stream.model, now=self.now_wall(), requests=0,
                                              usage=stream.usage)
                outcome = stream.attempts[-1].outcome if stream.attempts else "abandoned"
                self.audit(walk, outcome=outcome, candidate=stream.candidate, answer=stream.delivered_text,
                           usage=stream.usage, cost=stream.cost_usd)


def _timed_out(lane: OpenAICompatibleLane, *, first: bool = False) -> AttemptTimedOut:
    if first:
        return AttemptTimedOut(f"no first chunk within the lane's first_token_s={lane.config.first_token_s}")
    return AttemptTimedOut(f"no answer within the lane's attempt_timeout_s={lane.config.attempt_timeout_s}")

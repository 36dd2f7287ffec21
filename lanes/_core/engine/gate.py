"""The gate before every attempt: may this candidate be sent a request now?

First what other processes sharing the host's state file wrote since the last look (a kill switch,
a backoff: see `StateSync.catch_up`). Then, in order: the free lane's kill switch, the runtime kill
switch, enough time left before the job's deadline, the canary's quarantine, the FreeTierManager
(backoff, quota, credits), the single probe of a cold free candidate (others wait for its answer),
and the breakers (the model's and the lane's). A candidate that fails any check is skipped with its
reason recorded and nothing sent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import attrs
import trio

from lanes._core.engine.probes import Probes
from lanes._core.freetier.manager import FreeTierManager
from lanes._core.model.clocks import EpochTime
from lanes._core.model.job import Candidate
from lanes._core.model.record import JobRecord
from lanes._core.policy.breakers import LaneBreakers, Pass
from lanes._core.upstream.lane import OpenAICompatibleLane


@attrs.frozen(kw_only=True)
class Admission:
    """What an admitted attempt holds until it settles: breaker permits, and the probe it
    carries."""

    granted: Pass
    probe: str | None  # the cold scope this attempt probes for everyone, if any


class Gate:
    def __init__(
        self,
        *,
        lanes: Mapping[str, OpenAICompatibleLane],
        breakers: Mapping[str, LaneBreakers],
        manager: FreeTierManager,
        probes: Probes,
        now_wall: Callable[[], EpochTime],
        free_lane_on: bool,
        catch_up: Callable[[], None] = lambda: None,
    ) -> None:
        self._catch_up = catch_up  # take what other processes on the host wrote (see sync.py)
        self._lanes = lanes
        self._breakers = breakers
        self._manager = manager
        self._probes = probes
        self._now_wall = now_wall
        self.free_lane_on = free_lane_on
        self.switched_off: set[str] = (
            set()
        )  # lanes switched off at runtime (kept in the state store)
        self.quarantine: dict[str, str] = {}  # "lane/model" → why the canary took it out of routing
        self.canary_probing = False  # the canary probes quarantined models so they can pass again

    def switched(self, candidate: Candidate) -> str | None:
        """Why a kill switch keeps `candidate` off, or None."""
        if candidate.tier == "free" and not self.free_lane_on:
            return "free lane off (FREE_LANE=off)"
        if candidate.lane in self.switched_off:
            return "lane switched off"
        return None

    def quarantined(self, candidate: Candidate) -> bool:
        """The canary took `candidate` out of routing (and is not probing it right now)."""
        return candidate.key in self.quarantine and not self.canary_probing

    def held_back(self, candidate: Candidate) -> str | None:
        """Why the quarantine or the FreeTierManager holds `candidate` back now, or None."""
        if candidate.tier in ("local", "byok"):  # owned, or the client's own key: no shared quota
            return None
        now = self._now_wall()
        if candidate.tier == "free":
            if self.quarantined(candidate):
                return self.quarantine[candidate.key]
            verdict = self._manager.classify(candidate.lane, candidate.model, now)
            return None if verdict.free else verdict.reason
        backoff = self._manager.is_in_backoff(candidate.lane, candidate.model, now)
        return None if backoff is None else f"backoff ({backoff.reason}, {backoff.source})"

    def gone(self, candidate: Candidate) -> bool:
        """Held back because its upstream said the model does not exist (and that backoff is the
        one in force)."""
        backoff = self._manager.is_in_backoff(candidate.lane, candidate.model, self._now_wall())
        return backoff is not None and backoff.reason == "model_gone"

    def refusal(self, candidate: Candidate) -> str | None:
        """Why `candidate` can not be sent anything now — kill switch, hold-back or an open
        breaker — or None when it could (the probe and the time left are a job's business, not
        checked here)."""
        reason = self.switched(candidate) or self.held_back(candidate)
        if reason is None and self._breakers[candidate.lane].is_open(
            candidate.model, trio.current_time()
        ):
            reason = self._breakers[candidate.lane].refusal(candidate.model, trio.current_time())
        return reason

    def lane_refusal(self, candidate: Candidate) -> str | None:
        """Why every candidate of `candidate`'s lane and tier is refused now — a kill switch, an
        account-wide hold, the lane's own breaker — or None."""
        reason = self.switched(candidate)
        if reason is None and candidate.tier == "free":
            reason = self._manager.held_lane_wide(candidate.lane, candidate.model, self._now_wall())
        if reason is None:
            reason = self._breakers[candidate.lane].lane_refusal(trio.current_time())
        return reason

    def free_now(self, candidate: Candidate) -> bool:
        return self.refusal(candidate) is None

    async def admit(self, candidate: Candidate, record: JobRecord) -> Admission | None:
        """Breaker permits (and the probe scope held, if any) for one attempt, or None after
        recording why `candidate` is skipped. Waits while another job probes a cold free
        candidate."""
        lane = self._lanes[candidate.lane]
        self._catch_up()  # a kill switch or a backoff another process wrote a moment ago
        reason = self.switched(candidate)
        if reason is not None:
            record.skip(candidate, reason)
            return None
        probe = None
        while True:
            if record.deadline_at - trio.current_time() < max(lane.config.min_useful_s, 1e-9):
                record.short_of()
                record.skip(candidate, "too little time left")
                return None
            reason = self.held_back(candidate)
            if reason is not None:
                if candidate.tier == "free" and not self.quarantined(candidate):
                    record.held_back(candidate)  # a quarantine is no capacity wait
                record.skip(candidate, reason, never="gone" if self.gone(candidate) else None)
                return None
            if candidate.tier != "free" or not self._manager.needs_probe(
                candidate.lane, candidate.model
            ):
                break
            scope = self._manager.scope(candidate.lane, candidate.model)
            claimed = await self._probes.claim(scope, lane, record)
            if claimed:
                probe = scope
                break
            if claimed is None:
                record.skip(candidate, "another job is probing it")
                return None
            self._catch_up()
        breakers = self._breakers[candidate.lane]
        granted = breakers.acquire(candidate.model, trio.current_time())
        if granted is None:
            self._probes.release(probe)
            record.skip(candidate, breakers.refusal(candidate.model, trio.current_time()))
            return None
        return Admission(granted=granted, probe=probe)

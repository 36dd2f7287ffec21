"""The gate before every attempt: may this candidate be sent a request now?

First what other processes sharing the host's state file wrote since the last look (a kill switch,
a backoff: see `StateSync.catch_up`). Then, in order: the free lane's kill switch, the runtime kill
switch, enough time left before the job's deadline, the canary's quarantine, the FreeTierManager
(backoff, quota, credits), the single probe of a cold free candidate (others wait for its answer),
and the breakers (the model's and the lane's). A candidate that fails any check is skipped with its
reason recorded and nothing sent.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import attrs
import trio

from lanes._core.engine.backlog import Backlog
from lanes._core.engine.probes import Probes
from lanes._core.engine.waiting import WaitingRoom
from lanes._core.freetier.manager import FreeTierManager
from lanes._core.model.candidates import Candidate, Outcome
from lanes._core.model.clocks import EpochTime
from lanes._core.model.record import JobRecord
from lanes._core.policy.breakers import LaneBreakers, Pass
from lanes._core.upstream.lane import OpenAICompatibleLane


@attrs.frozen(kw_only=True)
class Admission:
    """What an admitted attempt holds until it ends: breaker permits, and the probe it
    carries."""

    lane: str
    granted: Pass
    probe: str | None  # the cold scope this attempt probes for everyone, if any


#: The outcomes in which the upstream answered sanely: a success for its breakers.
_SUCCESS: frozenset[str] = frozenset({"ok", "final", "context_length", "model_gone"})


class Switchboard:
    """The switches an operator or the canary throws, in this process: the free lane (`FREE_LANE`,
    fixed at start), the lanes switched off at runtime (kept in the state store, which the sync
    follows), the canary's quarantine, and whether the canary is probing the quarantined models."""

    def __init__(self, *, free_lane_on: bool) -> None:
        self._free_lane_on = free_lane_on
        self._off: set[str] = set()
        self._quarantine: dict[str, str] = {}  # "lane/model" → why the canary took it out
        self._probing = False

    @property
    def free_lane_on(self) -> bool:
        return self._free_lane_on

    def switch(self, lane: str, off: bool) -> bool:
        """Switch `lane` off (or on); True when that changed anything."""
        if off == (lane in self._off):
            return False
        (self._off.add if off else self._off.discard)(lane)
        return True

    def is_off(self, lane: str) -> bool:
        return lane in self._off

    def switched_off(self) -> frozenset[str]:
        return frozenset(self._off)

    def quarantine(self, current: Mapping[str, str]) -> None:
        """The canary's quarantine is now `current` ("lane/model" → why)."""
        self._quarantine = dict(current)

    def quarantined(self) -> dict[str, str]:
        return dict(self._quarantine)

    def why_quarantined(self, key: str) -> str | None:
        """Why the canary keeps "lane/model" out of routing now (None while it probes them)."""
        return None if self._probing else self._quarantine.get(key)

    def canary_probing(self, on: bool) -> None:
        """While on, quarantined models are routed too: the canary probes them so they may pass."""
        self._probing = on


class Gate:
    def __init__(
        self,
        *,
        lanes: Mapping[str, OpenAICompatibleLane],
        manager: FreeTierManager,
        probes: Probes,
        now_wall: Callable[[], EpochTime],
        switchboard: Switchboard,
        catch_up: Callable[[], None],
        room: WaitingRoom,
        backlog: Backlog,
    ) -> None:
        """`catch_up` takes what other processes on the host wrote a moment ago (see sync.py);
        `room` is where jobs that asked to wait for a free quota wait; `backlog`, how much work
        that can wait is left (see backlog.py)."""
        self._catch_up = catch_up
        self.room = room
        self.work_left = backlog
        self._lanes = lanes
        self._breakers = {name: LaneBreakers(lane.config.breaker) for name, lane in lanes.items()}
        self._manager = manager
        self._probes = probes
        self._now_wall = now_wall
        self._switches = switchboard

    def breakers(self, lane: str) -> LaneBreakers:
        return self._breakers[lane]

    def switched(self, candidate: Candidate) -> str | None:
        """Why a kill switch keeps `candidate` off, or None."""
        if candidate.tier == "free" and not self._switches.free_lane_on:
            return "free lane off (FREE_LANE=off)"
        if self._switches.is_off(candidate.lane):
            return "lane switched off"
        return None

    def held_back(self, candidate: Candidate, headroom: float = 0.0) -> str | None:
        """Why the quarantine or the FreeTierManager holds `candidate` back now (for work that
        leaves `headroom` of every free quota to interactive work), or None."""
        if candidate.tier in ("local", "byok"):  # owned, or the client's own key: no shared quota
            return None
        now = self._now_wall()
        if candidate.tier == "free":
            quarantined = self._switches.why_quarantined(candidate.key)
            if quarantined is not None:
                return quarantined
            verdict = self._manager.classify(candidate.lane, candidate.model, now, headroom)
            return None if verdict.free else verdict.reason
        backoff = self._manager.is_in_backoff(candidate.lane, candidate.model, now)
        return None if backoff is None else f"backoff ({backoff.reason}, {backoff.source})"

    def spare_rank(self, candidate: Candidate) -> tuple[float, float] | None:
        """While batches have items left, where an interactive job puts `candidate` to spare
        them (lower first; see backlog.py): the requests of its day batch items may still use (0
        when kept off it for the day; unknown: infinite), then how long (s) they are kept off it,
        longer first. None when no batch has items left, or `candidate` is not a free one the job
        may use now."""
        if candidate.tier != "free" or not self.work_left.spared:
            return None
        now, lane, model = self._now_wall(), candidate.lane, candidate.model
        if not self._manager.classify(lane, model, now).free:
            return None
        headroom = self.work_left.headroom
        verdict = self._manager.classify(lane, model, now, headroom)
        kept_off = 0.0 if verdict.free else max(0.0, (verdict.free_again_at or now) - now)
        day = self._manager.day_left(lane, model, now, headroom)
        return (math.inf if day is None else day, -kept_off)

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
        self._catch_up()  # a kill switch or a backoff another process wrote a moment ago
        reason = self.switched(candidate)
        if reason is not None:
            record.skip(candidate, reason)
            return None
        cleared, probe = await self._cleared(candidate, record)
        if not cleared:
            return None
        breakers = self._breakers[candidate.lane]
        granted = breakers.acquire(candidate.model, trio.current_time())
        if granted is None:
            self._probes.release(probe)
            record.skip(candidate, breakers.refusal(candidate.model, trio.current_time()))
            return None
        return Admission(lane=candidate.lane, granted=granted, probe=probe)

    async def _cleared(self, candidate: Candidate, record: JobRecord) -> tuple[bool, str | None]:
        """May `candidate` be sent now — with the time left, not held back, and a cold free one
        probed: (True, the probe's scope when this job probes it), or (False, None) after
        recording why not. Waits while another job probes it. A job going beside a probe (past
        its quiet time) is held to what every job is held to first: the wait may have used up a
        quota, or brought a backoff."""
        lane = self._lanes[candidate.lane]
        beside = False
        while True:
            if record.deadline_at - trio.current_time() < max(lane.config.min_useful_s, 1e-9):
                record.short_of()
                record.skip(candidate, "too little time left")
                return False, None
            reason = self.held_back(candidate, record.job.headroom)
            if reason is not None:
                if candidate.tier == "free" and not self._switches.why_quarantined(candidate.key):
                    record.held_back(candidate)  # a quarantine is no capacity wait
                record.skip(candidate, reason, never="gone" if self.gone(candidate) else None)
                return False, None
            if beside or (
                candidate.tier != "free"
                or not self._manager.needs_probe(candidate.lane, candidate.model)
            ):
                return True, None
            scope = self._manager.scope(candidate.lane, candidate.model)
            claimed = await self._probes.claim(scope, lane, record)
            if claimed is True:
                return True, scope
            if claimed is None:
                record.skip(candidate, "another job is probing it")
                return False, None
            beside = claimed == "beside"  # on its way and nothing refused it: look once more
            self._catch_up()

    def probe_sent(self, admission: Admission) -> None:
        """The probe `admission` carries has left: the jobs waiting for it go beside it once its
        lane's `probe_quiet_s` passes with no answer."""
        if admission.probe is not None:
            quiet_s = self._lanes[admission.lane].config.probe_quiet_s
            self._probes.sent(admission.probe, quiet_s)

    def probe_answered(self, admission: Admission) -> Admission:
        """The probe `admission` carries showed its model serving (its first chunk): the jobs
        waiting for it go now, not when its answer ends. Returns the admission without it."""
        if admission.probe is None:
            return admission
        self._probes.release(admission.probe)
        return attrs.evolve(admission, probe=None)

    def release(
        self, admission: Admission, outcome: Outcome, *, connection: bool, neutral: bool
    ) -> None:
        """Give back what `admission` holds — the breaker permits, counting `outcome`, and the
        probe. `neutral`: the request never reached the upstream, so it proves nothing."""
        breakers = self._breakers[admission.lane]
        if neutral:
            breakers.release(admission.granted)
        elif outcome == "fault":
            breakers.count(admission.granted, "fault", trio.current_time(), connection=connection)
        elif outcome in _SUCCESS:
            breakers.count(admission.granted, "success", trio.current_time())
        else:  # rate limits, credits, our deadline, a client gone: they prove nothing about health
            breakers.release(admission.granted)
        self._probes.release(admission.probe)

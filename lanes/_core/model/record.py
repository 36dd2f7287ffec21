"""One job's record: what was sent, what was skipped and why, and the error it ends with. Pure.

The walk writes into it; the audit, the reply and every `JobFailed` are read from it. Times are on
trio's clock and passed in.
"""

from __future__ import annotations

# lanes: pure
from collections.abc import Iterable
from typing import Any

import attrs

from lanes._core.model.candidates import Attempt, Candidate, Outcome, Route, Skip
from lanes._core.model.clocks import TrioTime
from lanes._core.model.errors import (
    DeadlineExceeded,
    FreeTierExhausted,
    JobFailed,
    ModelNotFound,
    NoLaneAvailable,
    PaidBudgetExhausted,
    Unservable,
)
from lanes._core.model.job import Job

#: Refusals an upstream answers before any model runs: an attempt ending so costs nothing and does
#: not count against `paid_attempts`. A 5xx or a 408 proves nothing (a gateway may time out while
#: the model runs and bills), so those keep the reservation and count.
REFUSED_UNBILLED = frozenset({400, 401, 402, 403, 404, 405, 409, 413, 415, 422, 429})
#: Fault categories that prove the request never reached the upstream (no connection was made,
#: or it could not be encoded): nothing to bill either.
NEVER_SENT = frozenset({"connect", "unencodable"})


def unbilled(status: int | None, category: str) -> bool:
    """Could an attempt that ended so not have been billed? (A refusal or a request never sent.)"""
    return status in REFUSED_UNBILLED or category in NEVER_SENT


_SHORT = 120  # characters of an attempt's detail quoted in a failure's message
#: Skips a record lists one by one; beyond, they are counted (a catalog may hold a thousand models).
MAX_SKIPS = 64


@attrs.frozen(kw_only=True)
class Verdict:
    """Why no candidate could ever serve a request (`policy/verdicts.py` says which): the error's
    code, what to say, the field."""

    code: str
    message: str
    param: str | None = None


class JobRecord:
    """One job's progress through its candidates: what was sent, what was skipped, and when."""

    def __init__(
        self, job: Job, *, deadline_at: TrioTime, started_at: TrioTime, streamed: bool = False
    ) -> None:
        self.job = job
        self.deadline_at = deadline_at
        self.started_at = started_at
        self.streamed = streamed  # asked for as a stream (the audit says so, for a replay)
        self.attempts: list[Attempt] = []
        self.skips: list[Skip] = []
        self.considered: dict[str, None] = {}  # every candidate key the walk looked at, in order
        self.plan: list[str] = []  # the candidates after the filters, in the order to try
        self.short_of_time = False
        self.free_blocked: list[Candidate] = []  # free candidates the free-tier manager held back
        self.request_class = "general"
        self.privacy = "any"  # the privacy the job needs: its own, else the policy's default
        # today's paid spend (USD) before its first paid attempt
        self.paid_before: float | None = None
        self.approval: str | None = None  # how paid fallback was consented to: allow, once, granted
        self.approved: str | None = None  # the "lane/model" an "approve once" lets through
        # the paid ceiling refused an attempt
        self.budget_refusal: PaidBudgetExhausted | None = None
        self.explored: str | None = None  # the runner-up this job was sent to on purpose
        self.sticky = False  # a multi-turn conversation kept on the model that served it
        # same-candidate retries after a transient fault (their own allowance)
        self.same_retries = 0
        # candidates that could never serve this job, each with why: a need it does not meet (a
        # `policy.STAGES` name), "context" (its upstream said the prompt does not fit), "gone"
        # (its upstream says the model does not exist)
        self.never: dict[str, str] = {}
        self.verdict: Verdict | None = None  # why, when the first plan had no candidate left
        self.skips_more = 0  # skips beyond `MAX_SKIPS`, counted, not listed
        self.lanes_skipped: dict[str, str] = {}  # "lane/*" → why the rest of it was passed over
        # a candidate passed over "not now" that the record did not list (beyond `MAX_SKIPS`, or a
        # lane passed over whole): the job may be served later, so it is never `Unservable`
        self.maybe_later = False
        # each wait for a paid-fallback approval: (started_at, ended_at on trio's clock, its id)
        self.waits: list[tuple[float, float, str]] = []
        self.waited_free_s = 0.0  # waited for a free quota to reopen (X-Lanes-Max-Wait), seconds

    @property
    def id(self) -> str:
        return self.job.id

    @property
    def free_tried(self) -> set[str]:
        """The distinct free candidates sent a request (a same-candidate retry adds none)."""
        return {a.key for a in self.attempts if a.tier == "free"}

    @property
    def paid_attempts(self) -> int:
        """Every paid request sent that could be billed, same-candidate retries included (one the
        upstream refused before any model ran, or that never reached it, could not)."""
        return sum(
            1 for a in self.attempts if a.tier == "paid" and not unbilled(a.status, a.category)
        )

    def route_for(self, candidate: Candidate) -> Route:
        """The route state an attempt on `candidate` stands for now."""
        if candidate.tier in ("local", "byok"):
            return candidate.tier
        if candidate.tier == "paid":
            return "paid_fallback"
        tried = self.free_tried
        return "primary" if not tried or tried == {candidate.key} else "free_retry"

    def consider(self, candidate: Candidate) -> None:
        self.considered.setdefault(candidate.key, None)

    @property
    def skips_left(self) -> int:
        """How many more skips the record lists one by one."""
        return MAX_SKIPS - len(self.skips)

    def skip(
        self, candidate: Candidate | Skip, reason: str | None = None, *, never: str | None = None
    ) -> None:
        """Pass over `candidate` for `reason`; `never`: why it could never serve this job (see
        `never`), when that is why."""
        if len(self.skips) >= MAX_SKIPS:
            self.skips_more += 1
            self.maybe_later = self.maybe_later or never is None
            return
        if never is not None:
            self.never[f"{candidate.lane}/{candidate.model}"] = never
        if isinstance(candidate, Skip):
            self.considered.setdefault(f"{candidate.lane}/{candidate.model}", None)
            self.skips.append(candidate)
            return
        self.consider(candidate)
        self.skips.append(Skip(lane=candidate.lane, model=candidate.model, reason=reason or ""))

    def skip_rest(self, lane: str, reason: str) -> None:
        """The rest of `lane`'s candidates were passed over for `reason`, without a line each."""
        self.lanes_skipped.setdefault(f"{lane}/*", reason)
        self.maybe_later = True

    def passed_over(self, count: int, *, maybe_later: bool) -> None:
        """`count` more candidates passed over without a line each; `maybe_later`: one of them
        only for now (so the job is never `Unservable`)."""
        self.skips_more += count
        self.maybe_later = self.maybe_later or maybe_later

    def planned(self, keys: Iterable[str]) -> None:
        """The candidates (keys) the plan holds, in the order to try, each once."""
        self.plan += [k for k in keys if k not in self.plan]

    def classified(self, request_class: str, privacy: str, verdict: Verdict | None) -> None:
        """The first plan's reading of the job: its class, the privacy it needs, and — when no
        candidate was left — why none could ever serve it."""
        self.request_class, self.privacy = request_class, privacy
        if verdict is not None:
            self.verdict = verdict

    def fronted(self, explored: str | None, sticky: bool) -> None:
        """The ranking put a runner-up first on purpose (`explored`), or kept a conversation on
        the model that served it (`sticky`)."""
        self.explored, self.sticky = explored, sticky

    def short_of(self) -> None:
        """Too little time was left for a candidate (or to ask for approval)."""
        self.short_of_time = True

    def held_back(self, candidate: Candidate) -> None:
        """The free-tier manager held `candidate` back for now (a capacity wait)."""
        self.free_blocked.append(candidate)

    def consented(self, how: str, candidate: Candidate | None = None) -> None:
        """Paid fallback was consented to: "allow", "granted", or "once" for `candidate`."""
        self.approval = how
        if candidate is not None:
            self.approved = candidate.key

    def waited(self, since: float, until: float, approval: str) -> None:
        """A wait for the approval `approval`, on trio's clock."""
        self.waits.append((since, until, approval))

    def refused_by_ceiling(self, refusal: PaidBudgetExhausted) -> None:
        self.budget_refusal = refusal

    def paying_from(self, spent_usd: float) -> None:
        """Today's paid spend before the job's first paid attempt (kept from the first)."""
        if self.paid_before is None:
            self.paid_before = spent_usd

    def free_wait(self, retry_after_s: float | None, now: float) -> float | None:
        """How long to wait for a free quota that reopens in `retry_after_s`, within the job's
        `max_wait_s` (what it waited before counted) and a second before its deadline — counted
        as waited; None: not (no wait asked for, or the quota reopens too late)."""
        budget = self.job.max_wait_s
        if budget is None or retry_after_s is None:
            return None
        pause = max(retry_after_s, 0.05)
        if self.waited_free_s + pause > budget or now + pause > self.deadline_at - 1.0:
            return None
        self.waited_free_s += pause
        return pause

    def retried_same(self) -> None:
        """A same-candidate retry after a transient fault (its own allowance)."""
        self.same_retries += 1

    def never_again(self, candidate: Candidate, why: str) -> None:
        """`candidate` can never serve this job: "context" (the prompt does not fit it), "gone"
        (its model does not exist), or a need it does not meet."""
        self.never[candidate.key] = why

    def sending(self, job: Job) -> None:
        """The conversation sent from now on (a resumed stream's prefill); same id, deadline."""
        self.job = job

    def all_skips(self) -> list[Skip]:
        """The skips listed, then one line per lane passed over whole and one for the count of
        the skips not listed (what the audit keeps)."""
        summary = [
            Skip(lane=key.partition("/")[0], model="*", reason=reason)
            for key, reason in self.lanes_skipped.items()
        ]
        if self.skips_more:
            summary.append(Skip(lane="*", model="*", reason=f"{self.skips_more} more, not listed"))
        return [*self.skips, *summary]

    def record(
        self,
        candidate: Candidate,
        outcome: Outcome,
        *,
        route: Route,
        duration_s: float,
        **details: Any,
    ) -> Attempt:
        self.consider(candidate)
        attempt = Attempt(
            lane=candidate.lane,
            model=candidate.model,
            tier=candidate.tier,
            outcome=outcome,
            route=route,
            duration_s=duration_s,
            **details,
        )
        self.attempts.append(attempt)
        return attempt

    def attach(self, exc: JobFailed) -> JobFailed:
        """Fill in what `exc` does not carry yet: the attempts, skips and request id so far."""
        return exc.told(attempts=self.attempts, skips=self.skips, request_id=self.id)

    def reasons(self) -> str:
        """Each candidate considered and why it did not serve, in the order they were looked at:
        its last attempt's failure if it was sent anything, else why it was skipped."""
        why: dict[str, str] = {}
        for skip in self.skips:
            why[f"{skip.lane}/{skip.model}"] = skip.reason
        for attempt in self.attempts:
            if attempt.outcome != "ok":
                why[attempt.key] = _describe(attempt)
        listed = [f"{key}: {why[key]}" for key in self.considered if key in why]
        listed += [f"{key}: {reason}" for key, reason in self.lanes_skipped.items()]
        if self.skips_more:
            listed.append(f"and {self.skips_more} more candidates passed over")
        return "; ".join(listed)

    def failed(
        self, *, now: float, next_free: tuple[float, str] | None = None, now_wall: float = 0.0
    ) -> JobFailed:
        """The error for a walk that ran out of candidates, naming each and its reason."""
        kw: dict[str, Any] = {"attempts": self.attempts, "skips": self.skips, "request_id": self.id}
        reasons = self.reasons()
        tail = f" — {reasons}" if reasons else ""
        never = self._never_served(tail, kw)
        if never is not None:
            return never
        if (
            now >= self.deadline_at
            or self.short_of_time
            or any(a.outcome == "deadline" for a in self.attempts)
        ):
            return DeadlineExceeded(
                f"the job's deadline passed before any lane answered{tail}", **kw
            )
        if self.budget_refusal is not None:
            refusal = self.budget_refusal
            return PaidBudgetExhausted(
                f"{refusal}{tail}", retry_after_s=refusal.retry_after_s, **kw
            )
        if self.free_blocked or any(  # a model still loading is no quota used up
            a.outcome in ("rate_limited", "credit_exhausted") and a.category != "loading"
            for a in self.attempts
        ):
            retry = max(0.0, next_free[0] - now_wall) if next_free else None
            when = f"; {next_free[1]} reopens in {retry:.1f}s" if next_free else ""
            return FreeTierExhausted(
                f"free capacity is exhausted{when}{tail}",
                retry_after_s=retry,
                next_eligible=next_free[1] if next_free else None,
                **kw,
            )
        return NoLaneAvailable(
            f"no lane could serve{tail}" if tail else "no lane could serve: no candidate", **kw
        )

    def _never_served(self, tail: str, kw: dict[str, Any]) -> JobFailed | None:
        """The error for a job that no candidate it considered could ever serve — `Unservable`, or
        `ModelNotFound` when each upstream says the model named does not exist — or None when
        one might later (then the failure is "not now")."""
        why = [self.never.get(key) for key in self.considered]
        if not why or None in why or self.maybe_later:
            return None
        if "gone" in why:
            if self.job.model == "auto" or set(why) != {"gone"}:
                return None  # the catalog changed under it: another model may serve it later
            message = f"model {self.job.model!r} does not exist upstream{tail}"
            return ModelNotFound(message, **kw)
        if self.verdict is not None and not self.attempts:
            verdict = self.verdict
            return Unservable(
                f"{verdict.message}{tail}", code=verdict.code, param=verdict.param, **kw
            )
        if set(why) == {"context"}:  # as the Messages API says it (Claude Code compacts on it)
            message = f"prompt is too long: it does not fit any candidate's context{tail}"
            return Unservable(message, code="context_length_exceeded", param="messages", **kw)
        return Unservable(f"no candidate can serve this request{tail}", **kw)


def _describe(attempt: Attempt) -> str:
    detail = " ".join(attempt.detail.split())
    if len(detail) > _SHORT:
        detail = detail[: _SHORT - 1] + "…"
    if attempt.outcome == "deadline":
        return "cut by the job's deadline"
    return detail or attempt.outcome.replace("_", " ")

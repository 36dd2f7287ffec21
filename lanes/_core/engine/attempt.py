"""One attempt, in one place: admitted at the gate, budgeted, sent, ended, recorded.

```python
async with open_attempt(routing, record, candidate, quotes=quotes, retry=False) as run:
    if run is None:                      # skipped at the gate: the reason is recorded
        ...
    response = await run.lane.complete(run.job, run.candidate.model)   # under the caller's scope
    reply = served(run, response)        # (calls.py) ends it: breakers, ranking, quota, ledger
```

`open_attempt` owns everything the attempt holds — breaker permits, the probe of a cold scope, the
paid gate's hold (`money/paid.py`) — and gives each back on every way out: success, an upstream
error (ended by its class), the job's deadline, a client that went away, or a local exception.
Nothing is released by remembering to: `end` runs exactly once, and leaving the block ends
what is still open. The job it sends is its quote's, worked out once per candidate by the walk.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import trio

from lanes._core.engine.gate import Admission
from lanes._core.freetier.prices import usage_tokens
from lanes._core.model.candidates import Attempt, Candidate, Outcome
from lanes._core.model.errors import (
    AttemptTimedOut,
    CreditExhausted,
    JobFailed,
    ModelGone,
    RateLimited,
    UpstreamError,
)
from lanes._core.model.job import Job
from lanes._core.model.record import JobRecord
from lanes._core.money.paid import Hold, PaidPermit
from lanes._core.money.quote import Quotes
from lanes._core.policy.needs import estimate_tokens, max_output_tokens
from lanes._core.upstream.lane import OpenAICompatibleLane

if TYPE_CHECKING:
    from lanes._core.engine.context import Routing

log = logging.getLogger("lanes")
_BACKOFF = {
    RateLimited: "rate_limited",
    CreditExhausted: "credit_exhausted",
    ModelGone: "model_gone",
}


class AttemptRun:
    """One admitted attempt. `job` is the job as sent, from its quote (a paid attempt always
    carries a token cap); `permit` is the paid gate's consent, for a paid one."""

    def __init__(
        self,
        routing: Routing,
        record: JobRecord,
        candidate: Candidate,
        admission: Admission,
        *,
        quotes: Quotes,
        permit: PaidPermit | None,
        retry: bool,
    ) -> None:
        self._routing = routing
        self.record = record
        self.candidate = candidate
        self.lane: OpenAICompatibleLane = routing.catalog.lanes[candidate.lane]
        self.job: Job = record.job
        self.route = record.route_for(candidate)
        self.started = trio.current_time()
        self.cost_usd = 0.0
        self._retry = retry
        # shared quotas and backoffs: not for a client's own key (bring your own key)
        self._quota = candidate.tier != "byok"
        self._hold: Hold | None = None
        self._quotes = quotes
        self._permit = permit
        self._sent = False  # budgets taken, the request may have left: an attempt to record
        self._number: int | None = None  # the free-tier manager's number for it (`sending`)
        self._ended = False
        self._admission: Admission | None = admission

    @property
    def ended(self) -> bool:
        return self._ended

    async def begin(self) -> str | None:
        """Take the candidate's quote; have the paid gate count the attempt against the governors
        and hold its worst case — a credit attempt's against its credits, a paid one's under the
        ceiling — (or return why it can not be sent); count it against the quota. Raises
        `GovernorExhausted` or `PaidBudgetExhausted` (nothing sent, nothing recorded)."""
        routing, candidate = self._routing, self.candidate
        quote = routing.paid.quote(self._quotes, candidate)
        self.job = quote.job
        hold = await routing.paid.hold(self.record, quote, self._permit, shared=self._quota)
        if isinstance(hold, str):
            return hold
        self._hold = hold
        if self._quota:
            manager = routing.manager
            # what it may use of a token window its provider reports (read only then: the body)
            expected = (
                estimate_tokens(self.job) + (max_output_tokens(self.job.params) or 0)
                if manager.reports_tokens(candidate.lane, candidate.model)
                else 0
            )
            self._number = manager.sending(
                candidate.lane, candidate.model, now=routing.now_wall(), expected_tokens=expected
            )
        self._sent = True
        self.started = trio.current_time()
        return None

    @property
    def on_sent(self) -> Callable[[], None] | None:
        """For a completion's or a stream's probe: what the upstream client calls once its request
        has been handed over whole — the jobs waiting for it may go beside it a quiet time later
        (`Gate.probe_sent`). None otherwise (an embedding's probe holds them until it answers)."""
        if self._admission is None or self._admission.probe is None:
            return None
        return self._probe_sent

    def _probe_sent(self) -> None:
        if self._admission is not None:
            self._routing.gate.probe_sent(self._admission)

    def answered(self, status: int, headers: Mapping[str, str]) -> None:
        """The provider answered: it is reachable, and its rate-limit headers are news."""
        routing = self._routing
        routing.health.answered(self.candidate.lane)
        if not self._quota:
            return
        routing.manager.update_from_headers(
            self.candidate.lane,
            self.candidate.model,
            headers,
            status=status,
            now=routing.now_wall(),
            sent=self._number,
        )
        if 200 <= status < 300 and self._admission is not None:  # a probe's model is serving
            self._admission = routing.gate.probe_answered(self._admission)

    def fail(self, exc: UpstreamError) -> Attempt:
        """End an attempt that failed with an upstream error, by the error's class."""
        outcome: Outcome = exc.outcome
        if isinstance(exc, AttemptTimedOut) and trio.current_time() >= self.record.deadline_at:
            outcome = "deadline"  # our own deadline, not the upstream's failure
        routing, candidate = self._routing, self.candidate
        reason = _BACKOFF.get(type(exc))
        if isinstance(exc, ModelGone):
            routing.health.want_refresh(candidate.lane)  # it may have left the catalog
        if reason is not None and self._quota:
            routing.manager.back_off(
                candidate.lane,
                candidate.model,
                reason,  # type: ignore[arg-type]
                headers=exc.headers,
                status=exc.status,
                body=exc.body,
                now=routing.now_wall(),
                sent=self._number,
            )
            routing.sync.backoffs_changed()  # other processes hear of it now, not at the next tick
        if outcome != "deadline":
            log.info("lane %s: %s %s — %s", candidate.lane, candidate.model, outcome, exc)
        return self.end(
            outcome,
            # said inside a 200: the request was taken (and may be billed); its detail has the
            # status the provider gave the error
            status=200 if exc.in_band else exc.status,
            detail=str(exc),
            category=exc.category,
            connection=exc.connection,
            neutral=exc.category == "unencodable",
        )

    def end(
        self,
        outcome: Outcome,
        *,
        status: int | None = None,
        detail: str = "",
        category: str = "",
        usage: Mapping[str, Any] | None = None,
        connection: bool = False,
        neutral: bool = False,
    ) -> Attempt:
        """Close the attempt once: breakers, probe, ledger, ranking, free-tier usage, the record."""
        assert not self._ended, "an attempt ends once"
        self._ended = True
        routing, candidate, now = self._routing, self.candidate, trio.current_time()
        if usage is not None and outcome == "ok" and self._quota:
            routing.manager.count_usage(
                candidate.lane, candidate.model, now=routing.now_wall(), requests=0, usage=usage
            )
        self._release(outcome, connection=connection, neutral=neutral)
        if (hold := self._hold) is not None:
            self.cost_usd = routing.paid.settle(
                hold,
                outcome,
                status=status,
                category=category,
                usage=usage,
                spend_credits=self._quota,
            )
            self._hold = None
        if outcome in ("ok", "fault", "deadline", "rate_limited"):
            routing.ranking.note(candidate, outcome, now - self.started, routing.now_wall())
        if outcome == "ok":
            routing.ranking.remember(self.record.job, candidate.key, routing.now_wall())
        return self.record.record(
            candidate,
            outcome,
            route=self.route,
            duration_s=now - self.started,
            status=status,
            detail=detail,
            category=category,
            retry=self._retry,
            cost_usd=self.cost_usd,
            tokens=sum(usage_tokens(usage) or ()) if outcome == "ok" else 0,
            started_at=self.started,
        )

    def _release(self, outcome: Outcome, *, connection: bool, neutral: bool = False) -> None:
        """Give the gate back what it admitted (counting the outcome), once."""
        admission, self._admission = self._admission, None
        if admission is not None:
            self._routing.gate.release(admission, outcome, connection=connection, neutral=neutral)

    def close(self) -> None:
        """Leaving the attempt: end it if it is still open (the request's fate is unknown)."""
        if self._ended:
            return
        if not self._sent:
            self._release("abandoned", connection=False)
            if self._hold is not None:  # held, then never sent
                self._routing.paid.release(self._hold)
            return
        outcome: Outcome = (
            "deadline" if trio.current_time() >= self.record.deadline_at else "abandoned"
        )
        self.end(
            outcome, detail="cut by the job's deadline" if outcome == "deadline" else "abandoned"
        )


@asynccontextmanager
async def open_attempt(
    routing: Routing,
    record: JobRecord,
    candidate: Candidate,
    *,
    quotes: Quotes,
    permit: PaidPermit | None = None,
    retry: bool,
) -> AsyncIterator[AttemptRun | None]:
    """Admit, budget and hold one attempt for the block; yields None when the gate skipped it.
    `quotes` holds the walk's quotes; `permit` is the paid gate's consent (a paid candidate)."""
    admission = await routing.gate.admit(candidate, record)
    if admission is None:
        yield None
        return
    run = AttemptRun(
        routing, record, candidate, admission, quotes=quotes, permit=permit, retry=retry
    )
    try:
        try:
            refused = await run.begin()
        except JobFailed as exc:
            record.attach(exc)
            raise
        if refused is not None:
            record.skip(candidate, refused)
            yield None
            return
        yield run
    except UpstreamError as exc:
        if not run.ended:
            run.fail(exc)
        raise
    finally:
        run.close()

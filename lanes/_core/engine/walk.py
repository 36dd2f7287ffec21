"""The free-first walk over one job's plan, under its deadline.

local or free **primary** → on a retryable failure one **free retry** on a *different* free
candidate → at most `paid_attempts` **paid** requests, gated by consent (`free_tier_fallback`) and
each reserved under the daily paid ceiling. Budgets are counted honestly:

- a transient fault (5xx, reset, refused) may be retried on the same candidate after a short
  jittered pause — `transient_retries` per job, an allowance of its own, never the free retry;
- a short 429 is waited out only when the alternative would cost money or there is none;
- `free_attempts` counts distinct free candidates, so a job whose free primary faults still goes to
  another healthy free candidate before any paid one;
- every paid request counts against `paid_attempts`, same-candidate retries included;
- every attempt counts against `max_attempts` and the governors.

A silent candidate is not tried again; a context-length error moves on to a larger context; a final
error ends the walk at once. Each attempt itself — gate, budgets, call, settlement — is
`attempt.py`; what it sends and may cost, consent and the money it holds are the paid gate's
(`money/paid.py`), quoted once per candidate per walk.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Container
from contextlib import AbstractContextManager, AsyncExitStack, ExitStack
from typing import Generic, TypeVar

import trio

from lanes._core.engine.attempt import AttemptRun, open_attempt
from lanes._core.engine.context import Routing
from lanes._core.engine.order import LOOKAHEAD, order
from lanes._core.engine.waiting import RoomFull, Ticket, WaitingRoom
from lanes._core.model.candidates import Candidate
from lanes._core.model.errors import (
    AttemptTimedOut,
    FinalError,
    FreeTierExhausted,
    PaidBudgetExhausted,
    UpstreamError,
    UpstreamRejected,
)
from lanes._core.model.record import JobRecord
from lanes._core.money.paid import PaidPermit
from lanes._core.money.quote import Quotes
from lanes._core.policy.needs import input_bytes
from lanes._core.policy.plan_queue import Queue
from lanes._core.policy.policy import PolicyConfig, after_failure
from lanes._core.state.store import job_deadline

T = TypeVar("T")
#: What a door does with an admitted attempt: send it, and return its result (`stack` holds what
#: must stay open with the result, such as a stream's upstream response).
Call = Callable[[AttemptRun, AsyncExitStack], Awaitable[T]]
_SKIPPED = object()


async def walk(
    routing: Routing,
    record: JobRecord,
    call: Call[T],
    keep: AsyncExitStack,
    *,
    exclude: frozenset[str] = frozenset(),
    require_prefill: bool = False,
) -> T:
    """Walk the job's plan; return the result of the first attempt that succeeds.

    What the winning attempt holds (its settlement, a stream's response) moves into `keep`.
    `exclude` names "lane/model" keys not to try; `require_prefill` keeps only candidates that
    continue a trailing assistant message (both for resuming a broken stream).
    """
    token = job_deadline.set(record.deadline_at)  # every store call this job waits on ends by it
    try:
        with ExitStack() as place:
            ticket = None
            while True:
                try:
                    return await _walk(routing, record, call, keep, exclude, require_prefill)
                except FreeTierExhausted as exc:  # a free quota reopens within the job's wait?
                    pause = record.free_wait(exc.retry_after_s, trio.current_time())
                    if pause is None:
                        raise
                    if ticket is None:  # a place in the waiting room, else answered as without
                        try:
                            ticket = place.enter_context(_place(routing.gate.room, record))
                        except RoomFull:
                            raise exc from None
                    await routing.gate.room.wait(ticket, pause)  # cancelled with the job
    finally:
        job_deadline.reset(token)


def _place(room: WaitingRoom, record: JobRecord) -> AbstractContextManager[Ticket]:
    return room.place(record.job.client, record.deadline_at, input_bytes(record.job))


async def _walk(
    routing: Routing,
    record: JobRecord,
    call: Call[T],
    keep: AsyncExitStack,
    exclude: frozenset[str],
    require_prefill: bool,
) -> T:
    job = record.job
    quotes = Quotes(job)  # each candidate's quote, worked out once in this walk
    tried: Container[str] = ()
    for round_ in (0, 1):

        def kept(c: Candidate, tried: Container[str] = tried) -> bool:
            return (
                c.key not in exclude and (c.prefill or not require_prefill) and c.key not in tried
            )

        pool = routing.catalog.pool
        queue, pinned = order(routing, record, kept, first_round=round_ == 0)
        result = await _PlanWalk[T](routing, record, call, keep).run(queue, pinned, quotes)
        if result is not _SKIPPED:
            return result  # type: ignore[return-value]  # _SKIPPED is the only other value
        # an empty pool: fetch the catalogs once and try what they add, before saying "exhausted"
        if (
            round_
            or not routing.catalog.discovering()
            or record.deadline_at - trio.current_time() < 1.0
        ):
            break
        if not await routing.catalog.refresh_catalogs(record.deadline_at - 0.5):
            break
        tried = pool.by_key  # what the catalogs add is what the pool did not hold
        if not any(c.key not in tried for c in routing.catalog.resolve(job)):
            break
    raise routing.exhausted(record)


class _PlanWalk(Generic[T]):
    """One round's walk over its plan: each candidate in turn, within the job's budgets, until one
    serves. What it rules out for the rest of the job is kept here: candidates that failed so
    (silent, or too small a context) and, after a context-length error, the model on every lane
    and every context no larger than it."""

    def __init__(
        self, routing: Routing, record: JobRecord, call: Call[T], keep: AsyncExitStack
    ) -> None:
        self._routing, self._record, self._call, self._keep = routing, record, call, keep
        self._banned: set[str] = set()
        self._banned_models: set[str] = set()
        self._context_floor = 0

    async def run(self, remaining: Queue, pinned: bool, quotes: Quotes) -> T | object:
        """The first result an attempt gives, or `_SKIPPED` when the plan ran out."""
        record, policy = self._record, self._routing.policy()
        while remaining:
            candidate = remaining.pop()
            record.planned([candidate.key])
            if self._too_small(candidate):
                continue
            reason = self._out_of_budget(candidate, policy)
            if reason:
                record.skip(candidate, reason)
                continue
            result = await self._try(candidate, remaining, pinned, quotes)
            if result is not _SKIPPED:
                return result
        return _SKIPPED

    def _too_small(self, candidate: Candidate) -> bool:
        """Is `candidate` passed over for its context (recorded), after a context-length error?"""
        if candidate.model in self._banned_models:  # the same model elsewhere would not fit
            self._banned.add(candidate.key)
            self._record.never_again(candidate, "context")
        floor = self._context_floor
        if floor and candidate.context is not None and candidate.context <= floor:
            self._record.skip(candidate, f"context not larger than {floor}", never="context")
            return True
        return False

    def _out_of_budget(self, candidate: Candidate, policy: PolicyConfig) -> str | None:
        """Why this job may not send `candidate` anything more, or None."""
        record = self._record
        if candidate.key in self._banned:
            return "already failed in this job"
        if len(record.attempts) >= policy.max_attempts:
            return f"attempt cap ({policy.max_attempts}) reached"
        if (
            candidate.tier == "free"
            and len(record.free_tried - {candidate.key}) >= policy.free_attempts
        ):
            return f"free attempts ({policy.free_attempts}) used"
        if candidate.tier == "paid" and record.paid_attempts >= policy.paid_attempts:
            return f"paid attempts ({policy.paid_attempts}) used"
        return None

    async def _try(
        self, candidate: Candidate, remaining: Queue, pinned: bool, quotes: Quotes
    ) -> T | object:
        """Attempts on `candidate` — again after a transient fault while the policy allows —
        until one gives its result, or `_SKIPPED` when the candidate is done with."""
        record, retry = self._record, False
        while True:
            permit = None
            if candidate.tier == "paid":  # asked before every paid attempt: a grant may be revoked
                permit = await self._permit(candidate, pinned, quotes)
                if permit is None:
                    return _SKIPPED
            try:
                result = await self._attempt(candidate, quotes, permit, retry=retry)
            except PaidBudgetExhausted as exc:
                record.refused_by_ceiling(exc)
                record.skip(candidate, str(exc))
                return _SKIPPED
            except FinalError as exc:
                raise record.attach(
                    UpstreamRejected(
                        f"{candidate.key} rejected the request: {exc}",
                        upstream_status=exc.status or 400,
                        upstream_code=exc.code,
                    )
                ) from exc
            except UpstreamError as exc:
                if self._rules_out(candidate, exc):
                    return _SKIPPED
                pause = self._pause(candidate, exc, remaining)
                if pause is None:
                    return _SKIPPED
                record.retried_same()
                retry = True
                await trio.sleep(pause)
                continue
            if result is _SKIPPED:
                self._pass_over_lane(candidate, remaining)
            return result

    async def _attempt(
        self, candidate: Candidate, quotes: Quotes, permit: PaidPermit | None, *, retry: bool
    ) -> T | object:
        """One attempt; what it holds moves into the walk's `keep` when it succeeds. `_SKIPPED`
        when the gate said no."""
        attempt = open_attempt(
            self._routing, self._record, candidate, quotes=quotes, permit=permit, retry=retry
        )
        async with AsyncExitStack() as stack:
            run = await stack.enter_async_context(attempt)
            if run is None:
                return _SKIPPED
            result = await self._call(run, stack)
            self._keep.push_async_exit(stack.pop_all())
            return result

    async def _permit(
        self, candidate: Candidate, pinned: bool, quotes: Quotes
    ) -> PaidPermit | None:
        """The paid gate's permit for `candidate` (None: not now — recorded), unless a free quota
        reopens within the job's wait: then it waits rather than pay."""
        routing, record = self._routing, self._record
        if self._free_within_wait():
            record.skip(candidate, "a free quota reopens within the job's X-Lanes-Max-Wait")
            return None
        return await routing.paid.may_pay(
            record,
            routing.paid.quote(quotes, candidate),
            pinned=pinned,
            lane_min_s=routing.catalog.lanes[candidate.lane].config.min_useful_s,
        )

    def _free_within_wait(self) -> bool:
        """Does one of the job's free candidates reopen within what is left of its
        `max_wait_s`? Then it waits for it rather than pay."""
        record, routing = self._record, self._routing
        cooling = record.free_blocked or any(
            a.outcome in ("rate_limited", "credit_exhausted") for a in record.attempts
        )
        if record.job.max_wait_s is None or not cooling:
            return False
        found = routing.next_free(record.job)
        if found is None:
            return False
        wait = found[0] - routing.now_wall()
        left = record.deadline_at - trio.current_time() - 1.0
        return wait <= min(record.job.max_wait_s - record.waited_free_s, left)

    def _rules_out(self, candidate: Candidate, exc: UpstreamError) -> bool:
        """Does `exc` rule `candidate` out for the rest of the job (recorded)? A silent one is not
        tried again, nor — after a context-length error — its model anywhere, nor a context no
        larger."""
        record = self._record
        if isinstance(exc, AttemptTimedOut) or record.attempts[-1].outcome == "deadline":
            self._banned.add(candidate.key)
            return True
        if exc.outcome == "context_length":
            self._banned_models.add(candidate.model)
            self._banned.add(candidate.key)
            record.never_again(candidate, "context")
            self._context_floor = max(self._context_floor, candidate.context or 0)
            return True
        if exc.outcome == "model_gone":
            record.never_again(candidate, "gone")
        return False

    def _pause(self, candidate: Candidate, exc: UpstreamError, remaining: Queue) -> float | None:
        """Seconds to pause before retrying `candidate` itself, or None to move on."""
        routing, record = self._routing, self._record
        policy = routing.policy()
        allowance_left = record.same_retries < policy.transient_retries and (
            candidate.tier != "paid" or record.paid_attempts < policy.paid_attempts
        )
        alternatives = any(
            c.tier != "paid" and routing.gate.free_now(c)
            for c in remaining.peek(LOOKAHEAD)
            if c.key not in self._banned
        )
        choice, pause = after_failure(
            exc.outcome,
            retried=not allowance_left,
            wait_s=routing.backoff_wait(candidate),
            time_left_s=record.deadline_at - trio.current_time(),
            max_wait_s=policy.max_wait_s,
            alternatives_free=alternatives,
        )
        if choice == "next" or len(record.attempts) >= policy.max_attempts:
            return None
        return pause or policy.retry_pause_s * (1.0 + random.random())

    def _pass_over_lane(self, candidate: Candidate, remaining: Queue) -> None:
        """The gate turned `candidate` away: when the reason holds for its whole lane and tier (a
        kill switch, an account-wide hold, the lane's breaker), pass over the rest of them at
        once — listed while the record lists skips, then in one line."""
        reason = self._routing.gate.lane_refusal(candidate)
        if reason is None:
            return
        for c in remaining.drop_lane(candidate.lane, candidate.tier):
            if self._record.skips_left <= 0:
                self._record.skip_rest(candidate.lane, reason)
                return
            self._record.skip(c, reason)

"""The free-first state machine over one job's plan, under its deadline.

local or free **primary** → on a retryable failure one **free retry** → at most one **paid
fallback**, gated by consent (`free_tier_fallback`) and reserved under the daily paid ceiling.
A transient fault is retried once on the same candidate after a short jittered pause; a short 429
is waited out only when the alternative would cost money; a silent candidate is not tried again;
a context-length error moves to a larger context; a final error ends the walk at once. Every
attempt counts against the governors and the per-job attempt cap.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
import trio

from lanes._core.errors import (
    AttemptTimedOut, FallbackDenied, FallbackNeedsApproval, JobFailed, PaidBudgetExhausted,
    UpstreamError,
)
from lanes._core.routing.breaker import Permit
from lanes._core.job import Candidate, Job
from lanes._core.routing.policy import after_failure, make_plan, max_output_tokens, needs_of, worst_case_cost
from lanes._core.routing.record import Walk

if TYPE_CHECKING:
    from lanes._core.dispatcher import Dispatcher

T = TypeVar("T")


@attrs.frozen(kw_only=True)
class Try:
    """What an attempt function is handed: the candidate, the job as sent, and how to settle."""

    candidate: Candidate
    job: Job
    started: float
    permit: Permit
    settle_paid: Callable[[float | None], None]  # the real cost, or None for "as reserved"


Attempt = Callable[[Try, Walk], Awaitable[T]]


def _paid_job(job: Job, max_tokens: int) -> Job:
    """A paid attempt always carries a max token count, so its reservation is a true worst case."""
    if max_output_tokens(job.params) is not None:
        return job
    return attrs.evolve(job, params={**job.params, "max_tokens": max_tokens})


async def run(dispatcher: Dispatcher, walk: Walk, attempt: Attempt[T], *,
              exclude: frozenset[str] = frozenset(), require_prefill: bool = False) -> T:
    """Walk the job's plan; return the result of the first attempt that succeeds.

    `exclude` names "lane/model" keys not to try; `require_prefill` keeps only candidates that
    continue a trailing assistant message (both for resuming a broken stream).
    """
    d, job = dispatcher, walk.job
    banned: set[str] = set()
    tried: set[str] = set()
    for round_ in (0, 1):
        candidates = [c for c in d.resolve(job) if c.key not in exclude and (c.prefill or not require_prefill)
                      and c.key not in tried]
        remaining = _order(d, walk, candidates, first_round=round_ == 0)
        pinned = job.model in {c.key for c in candidates} and len(candidates) == 1
        result = await _walk(d, walk, attempt, remaining, banned, pinned)
        if result is not _FAILED:
            return result
        # an empty pool: fetch the catalogs once and try what they add, before saying "exhausted"
        if round_ or not d.discovering() or walk.deadline_at - trio.current_time() < 1.0:
            break
        tried = {c.key for c in candidates}
        if not await d.refresh_catalogs(walk.deadline_at - 0.5):
            break
        if not {c.key for c in d.resolve(job)} - tried:
            break
    raise d.exhausted(walk)


def _order(d: Dispatcher, walk: Walk, candidates: list[Candidate], *, first_round: bool) -> list[Candidate]:
    """The plan for this round: filtered, tiers in order, free ones by class and score; then a
    multi-turn conversation's model, or (sometimes) an exploration, moved to the front."""
    job, now = walk.job, d.now_wall()
    needs = needs_of(job)
    scores = d.ranking.scores([c for c in candidates if c.tier == "free"], needs, now)
    plan = make_plan(job, candidates, d.policy, keep_order=job.model != "auto", scores=scores)
    if first_round:
        walk.skips.extend(plan.removed)
        walk.request_class = plan.request_class
    if job.model != "auto":
        return list(plan.candidates)
    ordered, explored, sticky = d.ranking.front(plan.candidates, job, scores, now, d.free_now)
    walk.explored, walk.sticky = explored, sticky
    return ordered


async def _walk(d: Dispatcher, walk: Walk, attempt: Attempt[T], remaining: list[Candidate], banned: set[str],
                pinned: bool) -> T | object:
    policy = d.policy
    context_floor = 0
    while remaining:
        candidate = remaining.pop(0)
        reason = _not_now(walk, candidate, banned, context_floor, policy)
        if reason:
            walk.skip(candidate, reason)
            continue
        if candidate.tier == "paid" and not pinned and walk.approval is None and not await _consent(d, walk, candidate):
            continue
        retried = False
        while True:
            try:
                result = await _one(d, walk, candidate, attempt)
            except PaidBudgetExhausted as exc:
                walk.budget_refusal = exc
                walk.skip(candidate, str(exc))
                break
            if result is not _FAILED:
                return result
            exc = walk.last_error
            if isinstance(exc, AttemptTimedOut):
                banned.add(candidate.key)  # silent: not again within this job
                break
            if exc is None:
                break  # skipped at admission: the reason is recorded
            if exc.outcome == "context_length":
                banned.update(c.key for c in remaining if c.model == candidate.model)
                banned.add(candidate.key)
                context_floor = max(context_floor, candidate.context or 0)
                break
            wait = d.backoff_wait(candidate)
            alternatives = any(c.tier != "paid" and d.free_now(c) for c in remaining if c.key not in banned)
            choice, pause = after_failure(exc.outcome, retried=retried, wait_s=wait,
                                          time_left_s=walk.deadline_at - trio.current_time(),
                                          max_wait_s=policy.max_wait_s, alternatives_free=alternatives)
            if choice == "next" or len(walk.attempts) >= policy.max_attempts:
                break
            retried = True
            pause = pause or policy.retry_pause_s * (1.0 + random.random())
            await trio.sleep(pause)
    return _FAILED


def _not_now(walk: Walk, candidate: Candidate, banned: set[str], context_floor: int, policy: Any) -> str | None:
    if candidate.key in banned:
        return "already failed in this job"
    if context_floor and candidate.context is not None and candidate.context <= context_floor:
        return f"context not larger than {context_floor}"
    if len(walk.attempts) >= policy.max_attempts:
        return f"attempt cap ({policy.max_attempts}) reached"
    if candidate.tier == "free" and walk.free_attempts >= policy.free_attempts:
        return f"free attempts ({policy.free_attempts}) used"
    if candidate.tier == "paid" and walk.paid_attempts >= policy.paid_attempts:
        return f"paid attempts ({policy.paid_attempts}) used"
    return None


_FAILED = object()


async def _one(d: Dispatcher, walk: Walk, candidate: Candidate, attempt: Attempt[T]) -> T | object:
    """One admitted attempt: governors, paid reservation, the call; `_FAILED` when it failed."""
    walk.last_error = None
    admitted = await d.admit(candidate, walk)
    if admitted is None:
        return _FAILED
    permit, probe = admitted
    try:
        job, reservation = walk.job, None
        try:
            d.governors.take_attempt()
            d.count_request(candidate)  # counted when sent, so jobs in flight count against the quota
            if candidate.tier == "paid":
                job = _paid_job(job, d.policy.paid_max_tokens)
                reservation = await d.governors.reserve(candidate, job)
        except JobFailed as exc:
            d.breakers[candidate.lane].release(permit)
            exc.attempts, exc.skips = tuple(walk.attempts), tuple(walk.skips)
            raise

        def settle_paid(cost: float | None) -> None:
            if reservation is not None:
                d.governors.settle(reservation[0], reservation[1] if cost is None else cost)

        started = trio.current_time()
        try:
            return await attempt(
                Try(candidate=candidate, job=job, started=started, permit=permit, settle_paid=settle_paid), walk)
        except UpstreamError as exc:
            settle_paid(0.0 if exc.status is not None else None)  # an answered error is not billed
            walk.last_error = exc
            d.failed_attempt(walk, candidate, permit, started, exc)  # raises UpstreamRejected when final
            return _FAILED
    finally:
        d.probes.release(probe)


async def _consent(d: Dispatcher, walk: Walk, candidate: Candidate) -> bool:
    """May this job fall back to a paid candidate? Raises when asking ends without a yes."""
    mode = d.policy.free_tier_fallback
    if mode == "allow":
        walk.approval = "allow"
        return True
    if mode == "off":
        walk.skip(candidate, "paid fallback off (free_tier_fallback = off)")
        return False
    client = walk.job.client
    if d.approvals.granted(client):
        walk.approval = "granted"
        return True
    exhausted = tuple(dict.fromkeys([*(c.key for c in walk.free_blocked),
                                     *(f"{a.lane}/{a.model}" for a in walk.attempts if a.tier != "paid")]))
    cost = worst_case_cost(candidate, walk.job, d.policy.paid_max_tokens) or 0.0
    approval = d.approvals.open(client=client, exhausted=exhausted, candidate=candidate.key, cost=cost)
    wait_s = d.policy.approval_wait_s
    until = walk.deadline_at if wait_s is None else min(walk.deadline_at, trio.current_time() + wait_s)
    with trio.move_on_at(until):
        await approval.event.wait()
    kw = {"attempts": walk.attempts, "skips": walk.skips}
    if approval.decision is None:
        raise FallbackNeedsApproval(
            f"paid fallback to {candidate.key} needs approval {approval.id}", approval_id=approval.id,
            retry_after_s=max(1.0, d.seconds_to_next_free(walk) or 30.0), **kw)
    if approval.decision == "deny":
        raise FallbackDenied(f"paid fallback to {candidate.key} was denied ({approval.id})", **kw)
    walk.approval = approval.decision
    return True


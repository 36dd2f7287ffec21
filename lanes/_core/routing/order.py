"""A job's plan for one round of the walk: filtered and ordered, the removed recorded, a
conversation's model or an exploration moved to the front; looked at `LOOKAHEAD` ahead."""

from __future__ import annotations

import heapq
from collections.abc import Callable

from lanes._core.job import Candidate
from lanes._core.routing.autoplan import AutoPlan
from lanes._core.routing.context import Routing
from lanes._core.routing.plan_queue import ListSource, Queue
from lanes._core.routing.policy import make_plan, needs_of
from lanes._core.routing.pool import Group
from lanes._core.routing.record import JobRecord

#: How far ahead of the walk the plan is looked at: the front (a conversation's model, an
#: exploration) and a retry's free alternatives are found among these.
LOOKAHEAD = 16
#: The plan's first candidates the audit keeps (and every candidate the walk reached).
PLAN_SHOWN = 16


def order(
    routing: Routing, record: JobRecord, kept: Callable[[Candidate], bool], *, first_round: bool
) -> tuple[Queue, bool]:
    """The plan for this round, and whether the job pinned its one candidate: filtered, tiers in
    order, free ones by class and score; then a multi-turn conversation's model, or (sometimes)
    an exploration, moved to the front. An `auto` plan is drawn lazily (see `pool.py`)."""
    job = record.job
    needs = needs_of(job)
    auto: AutoPlan | None = None
    if job.model == "auto":
        routing.resolve(job)  # an embedding job may not ask for `auto`: UnknownModel
        auto = routing.auto_plan(job, needs, kept)
        queue, pinned = Queue(auto), False
        klass, privacy = auto.request_class, auto.privacy
    else:
        candidates = [c for c in routing.resolve(job) if kept(c)]
        plan = make_plan(job, candidates, routing.policy, keep_order=True, needs=needs)
        queue = Queue(ListSource(plan.candidates))
        pinned = len(candidates) == 1 and candidates[0].key == job.model
        klass, privacy = plan.request_class, plan.privacy
    if first_round and not record.attempts:  # the job's first plan (a resumed walk keeps it)
        if auto is not None:
            _record_removed(record, auto.removed)
        else:
            for skip in plan.removed:
                record.skip(skip)
        record.request_class = klass
        record.privacy = privacy
    if auto is not None:
        _front(routing, record, queue, auto)
    record.plan += [c.key for c in queue.peek(PLAN_SHOWN) if c.key not in record.plan]
    return queue, pinned


def _record_removed(record: JobRecord, removed: list[tuple[Group, str]]) -> None:
    """The candidates the plan's filters removed, in config order: one by one while the record
    lists skips, then counted."""
    streams = [
        [(p, c, reason) for p, c in group.members[: record.skips_left]] for group, reason in removed
    ]
    listed = 0
    for _, c, reason in heapq.merge(*streams, key=lambda m: m[0]):
        if record.skips_left <= 0:
            break
        record.skip(c, reason)
        listed += 1
    record.skips_more += sum(len(group.members) for group, _ in removed) - listed


def _front(routing: Routing, record: JobRecord, queue: Queue, plan: AutoPlan) -> None:
    """Move a multi-turn conversation's model (wherever it stands in the plan), or sometimes a
    runner-up among the next `LOOKAHEAD`, before the free leader."""
    job, now = record.job, routing.now_wall()
    ahead = queue.peek(LOOKAHEAD)
    looked = list(ahead)
    remembered = routing.ranking.remembered(job, now)
    sticky = routing.pool.by_key.get(remembered) if remembered else None
    if (
        sticky is not None
        and sticky not in ahead
        and sticky.tier == "free"
        and plan.contains(sticky)
    ):
        looked.append(sticky)
    scores = {c.key: plan.score_of(c) for c in looked if c.tier == "free"}
    order, record.explored, record.sticky = routing.ranking.front(
        looked, job, scores, now, routing.gate.free_now
    )
    queue.put_ahead(order, len(ahead))

"""A job's plan for one round of the walk: filtered and ordered, the removed recorded, a
conversation's model or an exploration moved to the front; looked at `LOOKAHEAD` ahead."""

from __future__ import annotations

import heapq
from collections.abc import Callable

from lanes._core.engine.context import Routing
from lanes._core.model.candidates import Candidate
from lanes._core.model.record import JobRecord
from lanes._core.policy.autoplan import AutoPlan
from lanes._core.policy.needs import Needs, needs_of
from lanes._core.policy.plan_queue import ListSource, Queue
from lanes._core.policy.policy import STAGES, make_plan, unmet
from lanes._core.policy.pool import Group
from lanes._core.policy.verdicts import never_served

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
        routing.catalog.resolve(job)  # an embedding job may not ask for `auto`: UnknownModel
        auto = routing.auto_plan(job, needs, kept)
        queue, pinned = Queue(auto), False
        klass, privacy = auto.request_class, auto.privacy
    else:
        candidates = [c for c in routing.catalog.resolve(job) if kept(c)]
        plan = make_plan(job, candidates, routing.policy(), keep_order=True, needs=needs)
        queue = Queue(ListSource(plan.candidates))
        pinned = len(candidates) == 1 and candidates[0].key == job.model
        klass, privacy = plan.request_class, plan.privacy
    if first_round and not record.attempts:  # the job's first plan (a resumed walk keeps it)
        verdict = None
        if auto is not None:
            _record_removed(record, auto.removed, needs, privacy)
            if auto.fits_none:  # say why, should nothing ever serve it
                firsts = [group.first for group, _ in auto.removed]
                verdict = never_served(job, firsts, needs, privacy)
        else:
            for skip in plan.removed:
                record.skip(skip, never=plan.unfit.get(f"{skip.lane}/{skip.model}"))
            if not plan.candidates:  # say why, should nothing ever serve it
                verdict = never_served(job, candidates, needs, privacy)
        record.classified(klass, privacy, verdict)
    if not job.headroom and routing.gate.work_left.spared:  # interactive, beside work that waits
        _spare_the_batches(routing, queue)
    if auto is not None:
        _front(routing, record, queue, auto)
    record.planned(c.key for c in queue.peek(PLAN_SHOWN))
    return queue, pinned


def _record_removed(
    record: JobRecord, removed: list[tuple[Group, str]], needs: Needs, privacy: str
) -> None:
    """The candidates the plan's filters removed, in config order: one by one while the record
    lists skips, then counted — each with the need it could never meet, if that is why (a group's
    members are alike, so its first says for all)."""
    never = {}
    for group, _ in removed:
        found = unmet(group.first, needs, privacy)
        never[id(group)] = None if found is None else STAGES[found[0]]
    streams = [
        [(p, c, reason, never[id(group)]) for p, c in group.members[: record.skips_left]]
        for group, reason in removed
    ]
    listed = 0
    for _, c, reason, why in heapq.merge(*streams, key=lambda m: m[0]):
        if record.skips_left <= 0:
            break
        record.skip(c, reason, never=why)
        listed += 1
    total = sum(len(group.members) for group, _ in removed)
    # some not listed, and one of them only "not now": the job may yet be served
    record.passed_over(total - listed, maybe_later=listed < total and None in never.values())


def _spare_the_batches(routing: Routing, queue: Queue) -> None:
    """Of the free candidates looked at, the one that spares batches most (see backlog.py) is
    tried first: the one with the least of its day left to batch items, the longest kept off
    among equals. Only that one moves (should it refuse, the rest follow in their order, one
    free attempt spent); every other candidate keeps its place."""
    ahead = queue.peek(LOOKAHEAD)
    free = [c for c in ahead if c.tier == "free"]
    ranked = [(rank, i) for i, c in enumerate(free) if (rank := routing.gate.spare_rank(c))]
    if not ranked or min(ranked)[1] == 0:
        return
    best = free[min(ranked)[1]]
    first = ahead.index(free[0])
    order = [c for c in ahead if c is not best]
    order.insert(first, best)
    queue.put_ahead(order, len(ahead))


def _front(routing: Routing, record: JobRecord, queue: Queue, plan: AutoPlan) -> None:
    """Move a multi-turn conversation's model (wherever it stands in the plan), or sometimes a
    runner-up among the next `LOOKAHEAD`, before the free leader."""
    job, now = record.job, routing.now_wall()
    ahead = queue.peek(LOOKAHEAD)
    looked = list(ahead)
    remembered = routing.ranking.remembered(job, now)
    sticky = routing.catalog.candidate(remembered) if remembered else None
    if (
        sticky is not None
        and sticky not in ahead
        and sticky.tier == "free"
        and plan.contains(sticky)
    ):
        looked.append(sticky)
    scores = {c.key: plan.score_of(c) for c in looked if c.tier == "free"}
    order, runner_up, kept = routing.ranking.front(looked, job, scores, now, routing.gate.free_now)
    record.fronted(runner_up, kept)
    queue.put_ahead(order, len(ahead))

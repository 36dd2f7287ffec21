"""The free-first policy as pure functions: what a job needs, the order to try, when to retry. Pure.

The plan for a job: owned (local) candidates first, then borrowed-free ones (those the request
class prefers first), then paid — after removing, with a recorded reason, every candidate that can
not serve this request: missing capabilities (tools, images, JSON mode), too small a context, or
a privacy need it does not meet.

A client's output cap is a ceiling, not a demand (`room.py`): a model that holds part of it is fit
when it holds enough, and within a tier the models that hold all of it go first.

What changes from moment to moment (kill switch, breaker, backoff, quota) is checked by the
dispatcher just before each attempt.
"""

from __future__ import annotations

# lanes: pure
from collections.abc import Mapping, Sequence
from typing import Literal

import attrs

from lanes._core.model.candidates import Candidate, Skip
from lanes._core.model.job import Job
from lanes._core.model.validators import at_least, at_most
from lanes._core.policy.needs import Needs, clamped, estimate_tokens, needs_of
from lanes._core.policy.room import MIN_CLAMPED_OUTPUT

FallbackMode = Literal["off", "ask", "allow"]


@attrs.frozen(kw_only=True)
class PolicyConfig:
    """`[policy]` in config. Durations in seconds, money in USD."""

    #: when free capacity is gone: `off` fails with 429 `free_tier_exhausted` and the exact wait;
    #: `ask` holds the job for a decision (approve once, approve for a duration, deny); `allow`
    #: falls back to paid without asking. A job that names one paid model
    #: (`"openai/gpt-4.1-mini"`) has consented by naming it
    free_tier_fallback: FallbackMode = "off"
    #: never use a paid candidate, even one named
    free_tier_only: bool = False
    #: distinct free candidates per job: the primary and one free retry
    free_attempts: int = attrs.field(default=2, validator=at_least(0))
    #: paid requests per job that could be billed, same-candidate retries and stream recoveries
    #: included (an unbilled refusal, or a request that never connected, does not count)
    paid_attempts: int = attrs.field(default=1, validator=at_least(0))
    #: same-candidate retries per job after a transient fault (5xx, reset, refused): an allowance
    #: of its own, never the free retry
    transient_retries: int = attrs.field(default=1, validator=at_least(0))
    #: every upstream attempt per job, retries included
    max_attempts: int = attrs.field(default=4, validator=at_least(1))
    #: a 429 asking for at most this long is waited out on the same candidate — only when the
    #: alternative would cost money or there is none
    max_wait_s: float = attrs.field(default=5.0, validator=at_least(0))
    #: jobs of one client waiting at once for a free quota to reopen (`X-Lanes-Max-Wait`): one more
    #: is answered as without the header (429 with the exact Retry-After)
    waiting_per_client: int = attrs.field(default=32, validator=[at_least(0), at_most(10_000)])
    #: jobs of all clients waiting at once for a free quota to reopen
    waiting_jobs: int = attrs.field(default=256, validator=[at_least(0), at_most(100_000)])
    #: the waiting jobs' requests, MB in all (messages and tools as sent)
    waiting_mb: float = attrs.field(default=64.0, validator=[at_least(0), at_most(100_000.0)])
    #: a transient fault (5xx, reset, refused) is retried once on the same candidate after this
    #: pause (× 1–2, jittered)
    retry_pause_s: float = attrs.field(default=0.25, validator=at_least(0))
    #: request class → preferred free `"lane/model"`s, tried first for that class; classes come
    #: from `X-Lanes-Class` / `Job.request_class`, else tools → `agentic`, code fences → `coding`,
    #: long input → `long_context`, else `general`
    classes: dict[str, list[str]] = attrs.field(factory=dict)
    #: estimated input above which a job is `long_context`
    long_context_tokens: int = attrs.field(default=32_000, validator=at_least(1))
    #: a global attempt governor: every attempt counts, shared through `state`
    attempts_per_minute: int | None = attrs.field(default=None, validator=at_least(1))
    #: a global attempt governor: every attempt counts, shared through `state`
    attempts_per_day: int | None = attrs.field(default=None, validator=at_least(1))
    #: the hard paid budget per UTC day (of the state store's clock; every host sharing the store
    #: holds to the lowest any of them is configured with, or to what `lanes ceiling set` set):
    #: each paid attempt reserves its worst case first (((input bytes + a tool prompt) × input
    #: price + max tokens × output price + images × `image_usd`) × `n`), then settles to the real
    #: cost
    paid_ceiling_usd_per_day: float = attrs.field(default=1.0, validator=at_least(0))
    #: how far this process's wall clock may be from the state store's (the host's clock for a
    #: SQLite file, the server's `TIME` for Redis) before paid fallback closes on it — see
    #: [Time and the ceiling](operations.md#time-and-the-ceiling-one-for-every-host)
    clock_tolerance_s: float = attrs.field(default=120.0, validator=at_least(0))
    #: the output cap of a paid (or credit) attempt: the smaller of the client's cap and this, sent
    #: in the parameter the lane honours (`max_tokens`, or `max_completion_tokens` for OpenAI),
    #: the other cap parameter not sent — so the reservation is a true worst case
    paid_max_tokens: int = attrs.field(default=4096, validator=at_least(1))
    #: `ask`: how long a job waits for a decision (unset: until its deadline)
    approval_wait_s: float | None = attrs.field(default=None, validator=at_least(0))
    #: the duration "approve for a while" grants
    approval_default_s: float = attrs.field(default=3600.0, validator=at_least(0))
    #: a job with less time left than this is not held for a decision: it ends in 504
    #: `deadline_exceeded`, leaving no approval behind
    approval_min_s: float = attrs.field(default=1.0, validator=at_least(0))
    #: how long an unused "approve once" (no waiting job took it) is kept for the client's retry of
    #: the same request
    once_ttl_s: float = attrs.field(default=600.0, validator=at_least(0))
    #: the default privacy need: `local` (owned lanes only), `zdr` (zero-data-retention models or
    #: local), `any`
    privacy: Literal["any", "zdr", "local"] = "any"


def request_class(job: Job, long_context_tokens: int, *, input_tokens: int | None = None) -> str:
    """The job's class: as given, else tools → agentic, code fences → coding,
    long → long_context. `input_tokens`: the job's `estimate_tokens`, when known already."""
    if job.request_class:
        return job.request_class
    if job.embedding:
        return "embedding"
    if job.params.get("tools"):
        return "agentic"
    text = " ".join(str(m["content"]) for m in job.messages if isinstance(m.get("content"), str))
    if "```" in text:
        return "coding"
    if (input_tokens if input_tokens is not None else estimate_tokens(job)) >= long_context_tokens:
        return "long_context"
    return "general"


#: What `unfit` checks, in its order: a candidate failing a later check met every earlier one.
STAGES = ("privacy", "kind", "tools", "images", "json_mode", "output", "context")


def unmet(candidate: Candidate, needs: Needs, privacy: str) -> tuple[int, str] | None:
    """(the index in `STAGES` of the first need `candidate` does not meet, why), or None."""
    if privacy == "local" and candidate.tier != "local":
        return 0, "privacy: local only"
    if privacy == "zdr" and candidate.tier != "local" and not candidate.zdr:
        return 0, "privacy: not zero-data-retention"
    if needs.embedding != candidate.embedding:
        return 1, "an embedding model" if candidate.embedding else "not an embedding model"
    if needs.tools and candidate.tools is False:
        return 2, "no tool calling"
    if needs.images and candidate.vision is False:
        return 3, "no vision"
    if needs.json_mode and candidate.json_mode is False:
        return 4, "no JSON mode"
    # the asked cap is a ceiling, lowered to what a model holds (`room`) — but never below the
    # least it must hold, and never a cap no context of this model could ever hold
    least = min(needs.output_tokens, MIN_CLAMPED_OUTPUT)
    cap = candidate.max_output_tokens
    if cap is not None and cap < least:
        return 5, f"writes at most {cap} tokens < {least} asked"
    if candidate.context is not None and needs.input_tokens + least > candidate.context:
        return 6, f"context {candidate.context} < ~{needs.input_tokens + least} tokens needed"
    if candidate.context is not None and needs.output_tokens > candidate.context:
        return 6, f"context {candidate.context} < {needs.output_tokens} output tokens asked"
    return None


def unfit(candidate: Candidate, needs: Needs, privacy: str) -> str | None:
    """Why `candidate` can not serve a request with `needs` and `privacy`, or None when it can."""
    found = unmet(candidate, needs, privacy)
    return None if found is None else found[1]


@attrs.frozen(kw_only=True)
class Plan:
    candidates: tuple[Candidate, ...]
    removed: tuple[Skip, ...]
    request_class: str
    privacy: str
    # the removed that could never serve it (`unfit`), each with the need it does not meet
    unfit: Mapping[str, str] = attrs.field(factory=dict)


def make_plan(
    job: Job,
    candidates: Sequence[Candidate],
    policy: PolicyConfig,
    *,
    keep_order: bool = False,
    scores: Mapping[str, float] | None = None,
    needs: Needs | None = None,
) -> Plan:
    """Order and filter the candidates for `job`: local, free (class-preferred first, then by
    `scores`, best first), paid.

    `keep_order` keeps the given order (an alias's own list) and only filters. `needs`: the job's
    `needs_of`, when known already.
    """
    scores = scores or {}
    needs = needs or needs_of(job)
    privacy = job.privacy if job.privacy != "any" else policy.privacy
    klass = request_class(job, policy.long_context_tokens, input_tokens=needs.input_tokens)
    preferred = policy.classes.get(klass, [])
    rank = {key: i for i, key in enumerate(preferred)}
    kept, removed, never = [], [], {}
    for candidate in candidates:
        found = unmet(candidate, needs, privacy)
        reason = None if found is None else found[1]
        if found is not None:
            never[candidate.key] = STAGES[found[0]]
        elif candidate.tier == "byok" and candidate.lane not in job.keys:
            reason = "bring-your-own-key lane: no key for it in the request"
        elif candidate.tier == "paid" and policy.free_tier_only:
            reason = "free_tier_only"
        if reason is None:
            kept.append(candidate)
        else:
            removed.append(Skip(lane=candidate.lane, model=candidate.model, reason=reason))
    tiers = {"local": 0, "byok": 1, "free": 2, "paid": 3}
    if keep_order:
        order = list(range(len(kept)))
    else:
        order = sorted(
            range(len(kept)),
            key=lambda i: (
                tiers[kept[i].tier],
                rank.get(kept[i].key, len(rank)),
                clamped(kept[i], needs),  # then those that hold the whole cap first
                -scores.get(kept[i].key, 0.0),
                i,
            ),
        )
    return Plan(
        candidates=tuple(kept[i] for i in order),
        removed=tuple(removed),
        request_class=klass,
        privacy=privacy,
        unfit=never,
    )


def fit(candidate: Candidate, needs: Needs) -> tuple[float, float]:
    """(context fit, capability fit) in [0, 1] for ranking: roomy known context and capabilities
    known to be there score higher than unknown ones."""
    if candidate.context is None:
        context = 0.5
    else:
        context = 1.0 if candidate.context >= 4 * max(needs.tokens, 1) else 0.8
    wanted = [
        (needs.tools, candidate.tools),
        (needs.images, candidate.vision),
        (needs.json_mode, candidate.json_mode),
    ]
    asked = [have for need, have in wanted if need]
    capability = 1.0 if not asked else sum(1.0 if have else 0.5 for have in asked) / len(asked)
    return context, capability


RetryChoice = Literal["same", "next"]


def after_failure(
    outcome: str,
    *,
    retried: bool,
    wait_s: float | None,
    time_left_s: float,
    max_wait_s: float,
    alternatives_free: bool,
) -> tuple[RetryChoice, float]:
    """What to do after a failed attempt: retry the same candidate after a pause, or move on.

    `retried`: the job's same-candidate allowance is used up. A transient fault is retried on the
    same candidate; a 429 whose wait is short is waited out only when the other options would cost
    money or there are none; nothing else is retried.
    """
    if retried:
        return "next", 0.0
    if outcome == "fault" and time_left_s > 1.0:
        return "same", 0.0
    if (
        outcome == "rate_limited"
        and wait_s is not None
        and wait_s <= max_wait_s
        and wait_s < time_left_s - 0.5
        and not alternatives_free
    ):
        return "same", wait_s
    return "next", 0.0

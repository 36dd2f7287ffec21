"""The candidates a job's walk considers, and what came of each: `Candidate` (a lane and model
the dispatcher may try), `Attempt` (a request sent), `Skip` (one passed over) and `Reply` (the
answer, with who served it) — and the words they are told in (`Tier`, `Route`, `Outcome`).

Pure: no I/O, no clock of its own; durations in seconds (`*_s`), times on trio's clock (`*_at`).
"""

from __future__ import annotations

# lanes: pure
import functools
from collections.abc import Mapping
from typing import Any, Literal

import attrs

Tier = Literal["local", "byok", "free", "paid"]  # byok: the client's own provider key
#: `cache`: answered from the response cache (nothing was sent)
Route = Literal["local", "byok", "primary", "free_retry", "paid_fallback", "cache"]

#: How an attempt ended. `ok` served; `skipped_*` never sent a byte. The breaker counts only
#: `fault`.
Outcome = Literal[
    "ok",
    "fault",  # refused, reset, 5xx, 408/425, garbage, truncated, lane's own time cap
    "rate_limited",  # 429: the free-tier manager's business, not ill health
    "credit_exhausted",  # 402
    "final",  # 400/401/403/413/422: the walk stops, nothing falls back
    "context_length",  # the prompt does not fit this model
    "model_gone",  # 404 / model_not_found
    "deadline",  # the job's own deadline fired: never the upstream's fault
    "abandoned",  # the caller stopped reading a stream early
    "discarded",  # we stopped reading it: a recovery's answer that said something else
]


@attrs.frozen(kw_only=True)
class Candidate:
    """One (lane, model) pair the dispatcher may try, with the tier it belongs to."""

    lane: str
    model: str
    tier: Tier
    context: int | None = None
    max_output_tokens: int | None = None  # the most output tokens it allows (None: its context)
    input_usd_per_mtok: float | None = None
    output_usd_per_mtok: float | None = None
    zdr: bool = False
    tools: bool | None = None
    vision: bool | None = None
    json_mode: bool | None = None
    prefill: bool = False  # continues a trailing assistant message (stream recovery can resume)
    image_usd: float | None = None  # the most one input image costs (None: unknown)
    cap_param: str = "max_tokens"  # the output cap the lane's dialect honours
    embedding: bool = False  # an embedding model: serves embedding jobs only, and only those
    reasoning: bool = False  # takes chat's `reasoning_effort` (a translated effort is sent to it)
    # request parameters that make the provider bill beyond the request (the lane declares them)
    billing_switches: frozenset[str] = frozenset()
    # the tool-use prompt the provider adds to a request with tools (None: not declared)
    tool_prompt_tokens: int | None = None

    @functools.cached_property
    def key(self) -> str:
        """ "lane/model": worked out once (a plan's walk asks it hundreds of times a job)."""
        return f"{self.lane}/{self.model}"


@attrs.frozen(kw_only=True)
class Attempt:
    """One request sent upstream (skips are `Skip`s, not attempts). Durations in seconds."""

    lane: str
    model: str
    tier: Tier
    outcome: Outcome
    route: Route = "primary"  # the state of the free-first route this attempt stood for
    status: int | None = None
    duration_s: float = 0.0
    detail: str = ""
    category: str = ""  # the kind of fault (connect, reset, timeout, server_error, malformed, ...)
    retry: bool = False  # a same-candidate retry after a transient fault
    cost_usd: float = 0.0  # what the ledger settled for it (paid attempts)
    tokens: int = 0  # prompt + completion tokens its (sane) usage reported
    started_at: float | None = None  # when it was sent, on trio's clock (for its trace span)

    @property
    def key(self) -> str:
        return f"{self.lane}/{self.model}"


@attrs.frozen(kw_only=True)
class Skip:
    """A candidate passed over without sending anything, and why."""

    lane: str
    model: str
    reason: str


@attrs.frozen(kw_only=True)
class Reply:
    """The upstream's `chat.completion` body (an embedding job's: its embeddings `list`) exactly as
    returned, and beside it who served it."""

    body: Mapping[str, Any]
    lane: str
    provider: str
    model: str
    route: Route
    attempts: tuple[Attempt, ...] = ()
    skips: tuple[Skip, ...] = ()
    cost_usd: float = 0.0  # what the job cost: every attempt's settled figure (X-Lanes-Cost-Usd)
    usage: Mapping[str, Any] | None = None
    explored: bool = False  # served by a runner-up tried on purpose, so the ranking does not ossify
    # the upstream's body bytes, for byte-exact relaying
    raw: bytes = attrs.field(default=b"", repr=False)
    request_id: str = ""  # the job's id: its audit row, and X-Lanes-Request-Id over HTTP
    # what the response cache did (X-Lanes-Cache): hit, miss, bypass; None: it is off for the job
    cache: Literal["hit", "miss", "bypass"] | None = None
    age_s: float | None = None  # a hit's: how old its entry is, seconds (Age)

    @property
    def text(self) -> str:
        """The first choice's message content ('' when there is none)."""
        try:
            return self.body["choices"][0]["message"].get("content") or ""
        except (KeyError, IndexError, TypeError, AttributeError):
            return ""

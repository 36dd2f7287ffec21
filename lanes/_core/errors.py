"""One exception tree for `lanes`. Errors carry data; messages never carry secrets or prompt text.

```
LanesError
├── ConfigError                  bad config: names the key, the rule, the value and the fix
├── JobFailed                    a job ended without an answer; carries .attempts and .skips
│   ├── DeadlineExceeded         the job's deadline passed                         (HTTP 504)
│   ├── NoLaneAvailable          every candidate was skipped or failed retryably   (HTTP 503)
│   │   └── FreeTierExhausted    free capacity is backed off or used up: .next_eligible (429; also a RetryLater)
│   ├── RetryLater               refused for now, with .retry_after_s               (HTTP 429)
│   ├── UnknownModel             the job names no model, alias or lane/model known (HTTP 404)
│   │   ├── PaidBudgetExhausted  a paid attempt would cross today's paid ceiling
│   │   ├── FallbackNeedsApproval paid fallback awaits a decision: .approval_id
│   │   └── GovernorExhausted    the global attempt governor is spent
│   ├── FallbackDenied           the paid fallback was denied for this client (HTTP 403)
│   ├── UpstreamRejected         a final upstream error (400/401/403/413/422)     (HTTP as given)
│   └── StreamInterrupted        a stream failed after chunks reached the caller
└── UpstreamError                one attempt failed; raised by the upstream client, handled by the
    │                            dispatcher, never seen by callers (translated once, from httpx2)
    ├── RetryableError           refused, reset, 5xx, 408, 425, garbage, truncated stream
    │   └── AttemptTimedOut      the lane's own time cap (not the job's deadline) ran out
    ├── RateLimited              429: .retry_after_s, .headers
    ├── CreditExhausted          402
    ├── ModelGone                404 / model_not_found
    ├── ContextLengthExceeded    the prompt does not fit the model
    └── FinalError               400, 401, 403, 413, 422: stops the walk, never falls back
```
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lanes._core.job import Attempt, Outcome, Skip


class LanesError(Exception):
    """Base of every error `lanes` raises on purpose."""


class ConfigError(LanesError):
    """The configuration is wrong. `key` is the dotted path of the offending key, when known."""

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class JobFailed(LanesError):
    """A job ended without an answer. `attempts` lists what was sent, `skips` what was not."""

    status = 503
    code = "no_lane_available"

    def __init__(
        self,
        message: str,
        *,
        attempts: Sequence[Attempt] = (),
        skips: Sequence[Skip] = (),
    ) -> None:
        super().__init__(message)
        self.attempts = tuple(attempts)
        self.skips = tuple(skips)


class DeadlineExceeded(JobFailed):
    status = 504
    code = "deadline_exceeded"


class NoLaneAvailable(JobFailed):
    status = 503
    code = "no_lane_available"


class RetryLater(JobFailed):
    """A job refused for now; `retry_after_s` says when trying again can succeed (None: unknown)."""

    status = 429

    def __init__(self, message: str, *, retry_after_s: float | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after_s = retry_after_s


class FreeTierExhausted(RetryLater, NoLaneAvailable):
    """Every free candidate is backed off or used up. `retry_after_s`: until the soonest reopens."""

    status = 429
    code = "free_tier_exhausted"

    def __init__(self, message: str, *, next_eligible: str | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.next_eligible = next_eligible


class PaidBudgetExhausted(RetryLater):
    code = "paid_budget_exhausted"


class FallbackNeedsApproval(RetryLater):
    code = "approval_required"

    def __init__(self, message: str, *, approval_id: str, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.approval_id = approval_id


class FallbackDenied(JobFailed):
    status = 403
    code = "fallback_denied"


class GovernorExhausted(RetryLater):
    code = "attempt_governor"


class UnknownModel(JobFailed):
    status = 404
    code = "model_not_found"


class UpstreamRejected(JobFailed):
    """A final upstream error, passed on unchanged in meaning: status and the upstream's code."""

    code = "upstream_rejected"

    def __init__(self, message: str, *, status: int, upstream_code: str | None = None, **kw: Any):
        super().__init__(message, **kw)
        self.status = status
        self.upstream_code = upstream_code


class StreamInterrupted(JobFailed):
    """A stream broke after the caller had received chunks; `delivered` chunks are not retracted."""

    status = 502
    code = "stream_interrupted"


class UpstreamError(LanesError):
    """One attempt failed. `outcome` is the class the dispatcher and breaker act on."""

    outcome: Outcome = "fault"

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        headers: Mapping[str, str] | None = None,
        body: Any = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.headers = dict(headers or {})
        self.body = body
        self.code = code


class RetryableError(UpstreamError):
    outcome = "fault"


class AttemptTimedOut(RetryableError):
    outcome = "fault"


class RateLimited(UpstreamError):
    outcome = "rate_limited"


class CreditExhausted(UpstreamError):
    outcome = "credit_exhausted"


class ModelGone(UpstreamError):
    outcome = "model_gone"


class ContextLengthExceeded(UpstreamError):
    outcome = "context_length"


class FinalError(UpstreamError):
    outcome = "final"

"""One exception tree for `lanes`. Errors carry data; messages never carry secrets or prompt text.

```
LanesError
├── ConfigError                   bad config: names the key, the rule, the value and the fix
├── JobFailed                     a job ended without an answer: .attempts, .skips, .request_id
│   ├── DeadlineExceeded          the job's deadline passed
│   ├── NoLaneAvailable           every candidate was skipped or failed; the message says why, each
│   │   ├── FreeTierExhausted     free capacity is backed off or used up: .next_eligible
│   │   │                         (also a RetryLater)
│   │   └── Unservable            no candidate could ever serve it — context, capability, privacy,
│   │                             kind: .code (context_length_exceeded, no_capable_model), .param
│   ├── RetryLater                refused for now: .retry_after_s
│   │   ├── PaidBudgetExhausted   a paid attempt would cross today's paid ceiling
│   │   ├── FallbackNeedsApproval paid fallback awaits a decision: .approval_id
│   │   └── GovernorExhausted     the global attempt governor is spent
│   ├── UnknownModel              the job names no model, alias or lane/model known
│   │   └── ModelNotFound         the upstreams say the model it names does not exist (404)
│   │                             (also a NoLaneAvailable)
│   ├── FallbackDenied            the paid fallback was denied for this client
│   ├── UpstreamRejected          a final upstream error (400/401/403/413/422): .upstream_status
│   └── StreamInterrupted         a stream failed after chunks reached the caller
└── UpstreamError                 one attempt failed; raised by the upstream client, handled by the
    │                             walk, never seen by callers (translated once, from httpx2)
    ├── RetryableError            refused, reset, 5xx, 408, 425, garbage, truncated stream
    │   └── AttemptTimedOut       the lane's own time cap (not the job's deadline) ran out
    ├── RateLimited               429: .retry_after_s, .headers
    │   └── ModelLoading          503 "Loading model": a local server still loading (no fault)
    ├── CreditExhausted           402
    ├── ModelGone                 404 / model_not_found
    ├── ContextLengthExceeded     the prompt does not fit the model
    └── FinalError                400, 401, 403, 413, 422: stops the walk, never falls back
```

Each `JobFailed` has a stable `code` (what the audit and the HTTP error body carry); the HTTP
status for each lives in `lanes._http.errors`, never here. Each `UpstreamError` has an `outcome`
(what the breaker and the walk act on) and a `category` (the provider error category the audit
and the reports count: `connect`, `reset`, `timeout`, `server_error`, `malformed`, …).
"""

from __future__ import annotations

# lanes: pure
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lanes._core.model.candidates import Attempt, Outcome, Skip

#: Transport faults that are the provider's (or the network's), not one model's.
CONNECTION_CATEGORIES = frozenset({"connect", "reset"})


class LanesError(Exception):
    """Base of every error `lanes` raises on purpose."""


class ConfigError(LanesError):
    """The configuration is wrong. `key` is the dotted path of the offending key, when known."""

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class JobFailed(LanesError):
    """A job ended without an answer. `attempts` lists what was sent, `skips` what was not;
    `request_id` is the job's id (its audit row, and `X-Lanes-Request-Id` over HTTP)."""

    code = "no_lane_available"

    def __init__(
        self,
        message: str,
        *,
        attempts: Sequence[Attempt] = (),
        skips: Sequence[Skip] = (),
        request_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.attempts = tuple(attempts)
        self.skips = tuple(skips)
        self.request_id = request_id

    def told(
        self, *, attempts: Sequence[Attempt] = (), skips: Sequence[Skip] = (), request_id: str
    ) -> JobFailed:
        """Fill in what this error does not carry yet: the job's attempts, skips and id."""
        self.attempts = self.attempts or tuple(attempts)
        self.skips = self.skips or tuple(skips)
        self.request_id = self.request_id or request_id
        return self


class DeadlineExceeded(JobFailed):
    code = "deadline_exceeded"


class NoLaneAvailable(JobFailed):
    code = "no_lane_available"


class Unservable(NoLaneAvailable):
    """No candidate could ever serve the request, whatever the moment: none has the context, the
    capability (tools, images, JSON mode), the privacy or the kind (chat, embedding) it needs.
    `code` says which (`context_length_exceeded`, `no_capable_model`); `param` names the request's
    field to change, when one does."""

    def __init__(
        self, message: str, *, code: str = "no_capable_model", param: str | None = None, **kw: Any
    ) -> None:
        super().__init__(message, **kw)
        self.code = code
        self.param = param


class RetryLater(JobFailed):
    """A job refused for now; `retry_after_s` says when trying again can succeed (None: unknown)."""

    code = "retry_later"

    def __init__(self, message: str, *, retry_after_s: float | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after_s = retry_after_s


class FreeTierExhausted(RetryLater, NoLaneAvailable):
    """Every free candidate is backed off or used up. `retry_after_s`: until the soonest reopens."""

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


class GovernorExhausted(RetryLater):
    code = "attempt_governor"


class UnknownModel(JobFailed):
    code = "model_not_found"


class ModelNotFound(UnknownModel, NoLaneAvailable):
    """The model the job names exists in config, but every upstream asked says it does not (404,
    `model_not_found`), now or within the backoff that answer began."""


class FallbackDenied(JobFailed):
    code = "fallback_denied"


class UpstreamRejected(JobFailed):
    """A final upstream error, passed on unchanged in meaning: the upstream's status and code."""

    code = "upstream_rejected"

    def __init__(
        self, message: str, *, upstream_status: int, upstream_code: str | None = None, **kw: Any
    ) -> None:
        super().__init__(message, **kw)
        self.upstream_status = upstream_status
        self.upstream_code = upstream_code


class StreamInterrupted(JobFailed):
    """A stream broke after the caller had received chunks; `delivered` chunks are not retracted.
    `upstream_status` and `upstream_code` are the provider's own when it said why, in the stream
    (None for a cut, a stall or the deadline)."""

    code = "stream_interrupted"

    def __init__(
        self,
        message: str,
        *,
        upstream_status: int | None = None,
        upstream_code: str | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(message, **kw)
        self.upstream_status = upstream_status
        self.upstream_code = upstream_code


class UpstreamError(LanesError):
    """One attempt failed. `outcome` is what the walk and the breaker act on; `category` names the
    kind of fault for the audit (`connect` and `reset` are the provider's, see `connection`).
    `in_band`: the provider said so inside a 200 answer (an error event in a stream, or an error
    body), so `status` is the one it gave there — the request was taken, and may have been
    billed."""

    outcome: Outcome = "fault"
    default_category = "fault"

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        headers: Mapping[str, str] | None = None,
        body: Any = None,
        code: str | None = None,
        category: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.headers = dict(headers or {})
        self.body = body
        self.code = code
        self.category = category or self.default_category
        self.in_band = False

    def answered(self, *, status: int, headers: Mapping[str, str]) -> None:
        """The HTTP answer this error was read from: its headers, and its status — unless the
        error was said inside a 200, which keeps the status it gave itself."""
        self.headers = dict(headers)
        if not self.in_band:
            self.status = status

    def said_in_band(self, where: str, body: Any, category: str | None) -> None:
        """The provider said this error inside a 200 `where` (a stream, a response), in `body`;
        a retryable one is of `category`."""
        self.args = (f"error inside a 200 {where}: {self}",)
        self.body, self.in_band = body, True
        if category is not None:
            self.category = category

    @property
    def connection(self) -> bool:
        """A connection-level fault (refused, reset, DNS, TLS): evidence about the whole
        provider."""
        return self.category in CONNECTION_CATEGORIES


class RetryableError(UpstreamError):
    outcome = "fault"


class AttemptTimedOut(RetryableError):
    outcome = "fault"
    default_category = "timeout"


class RateLimited(UpstreamError):
    outcome = "rate_limited"
    default_category = "rate_limited"


class ModelLoading(RateLimited):
    """A local server still loading its model (llama-server's 503 "Loading model"): nothing
    wrong with it — no fault against its breaker, no quota used up: the job moves on, and the
    model is tried again by the next job (or after the walk's short pause)."""

    default_category = "loading"


class CreditExhausted(UpstreamError):
    outcome = "credit_exhausted"
    default_category = "credit_exhausted"


class ModelGone(UpstreamError):
    outcome = "model_gone"
    default_category = "model_gone"


class ContextLengthExceeded(UpstreamError):
    outcome = "context_length"
    default_category = "context_length"


class FinalError(UpstreamError):
    outcome = "final"
    default_category = "rejected"

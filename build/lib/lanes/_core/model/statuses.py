"""How each way a job can fail is answered — its HTTP status — and which of them say "not now":
one rule for the sidecar's doors and for work that can wait (the batch runner and the library's
batches), which tries an item again later only where the status says so."""

from __future__ import annotations

from lanes._core.model.errors import (
    DeadlineExceeded,
    FallbackDenied,
    FreeTierExhausted,
    JobFailed,
    NoLaneAvailable,
    RetryLater,
    StreamInterrupted,
    UnknownModel,
    Unservable,
    UpstreamRejected,
)

#: The HTTP status of each way a job can fail; the most specific class wins (see `http_status`).
STATUSES: tuple[tuple[type[JobFailed], int], ...] = (
    (FreeTierExhausted, 429),
    (RetryLater, 429),
    (DeadlineExceeded, 504),
    (Unservable, 400),  # never: no candidate could serve it, whatever the moment
    (UnknownModel, 404),
    (NoLaneAvailable, 503),  # not now
    (FallbackDenied, 403),
    (StreamInterrupted, 502),
    (JobFailed, 503),
)

#: The statuses that say "try again later" — and only those: each is sent with `Retry-After`.
LATER = frozenset({429, 503})

#: what the paid gate records for a paid candidate of a job that never pays (see money/paid.py)
NEVER_PAYS = "work that can wait never pays (a batch item)"
#: ... and of one that may, on its batch's budget, when free capacity can not meet its window
BATCH_PAYS = "a batch item pays from its batch's budget"
#: a batch item's paid attempt starts only with at least this long left of its window (seconds)
BATCH_MIN_PAID_S = 5.0


def http_status(exc: JobFailed) -> int:
    """The status a failed job is answered with over HTTP (a final upstream error keeps its own)."""
    if isinstance(exc, UpstreamRejected):
        return exc.upstream_status
    if isinstance(exc, StreamInterrupted) and exc.upstream_status is not None:
        return exc.upstream_status  # what the provider said inside its stream
    return next(status for cls, status in STATUSES if isinstance(exc, cls))


def try_again_in(exc: JobFailed) -> float | None:
    """For work that can wait: seconds until an item whose job failed with `exc` is tried again
    (at least 1; its Retry-After when known) — only where the answer says "not now" and free
    capacity can come back (a quota, a backoff, a breaker, a lane unreachable) — else None: the
    failure is the item's answer."""
    if http_status(exc) not in LATER or _never_free(exc):
        return None
    return max(1.0, getattr(exc, "retry_after_s", None) or 1.0)


def _never_free(exc: JobFailed) -> bool:
    """Can this job never be served free (its only candidates paid, or none able)?"""
    if isinstance(exc, FreeTierExhausted):
        return False
    return (
        isinstance(exc, Unservable)
        or bool(exc.skips)
        and all(s.reason.startswith((NEVER_PAYS, BATCH_PAYS)) for s in exc.skips)
        and not exc.attempts
    )

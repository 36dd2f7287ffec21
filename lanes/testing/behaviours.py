"""What a fake provider does with one request: the behaviours a test or drill scripts per model."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs

ANSWER = "The quick brown fox jumps over the lazy dog."


@attrs.frozen(kw_only=True)
class Behaviour:
    """How the fake answers one request. Build them with the functions below."""

    kind: str
    delay_s: float = 0.0  # before the status line
    chunk_delay_s: float = 0.0  # between stream chunks
    status: int = 200
    body: Any = None
    headers: Mapping[str, str] = attrs.field(factory=dict)
    after: int = 0  # chunks sent before a stream fault
    text: str = ANSWER
    reported_model: str | None = None
    clean: bool = False  # stream_cut: end the body properly (but with no finish reason)
    limit: int = 0  # quota: requests allowed per window
    window_s: float = 60.0
    day_limit: int = 0  # quota: requests allowed per day as well (0: no daily limit)
    style: str = "openai"  # quota: how limits are reported — openai, openrouter, gemini (body only)
    # answer: the `usage` reported instead of an honest count — a value, or a function of the
    # request body (an upstream that bills the most it may, or one that reports garbage)
    usage: Any = None
    chunks: Callable[[], Iterable[bytes]] | None = None  # raw: the body, piece by piece


def answer(
    *,
    delay_s: float = 0.0,
    chunk_delay_s: float = 0.0,
    headers: Mapping[str, str] | None = None,
    text: str = ANSWER,
    reported_model: str | None = None,
    usage: Any = None,
) -> Behaviour:
    """A healthy answer; `usage` replaces the usage object it reports (any JSON value)."""
    return Behaviour(
        kind="answer",
        delay_s=delay_s,
        chunk_delay_s=chunk_delay_s,
        headers=headers or {},
        text=text,
        reported_model=reported_model,
        usage=usage,
    )


def raw(
    status: int = 200,
    body: bytes = b"",
    *,
    headers: Mapping[str, str] | None = None,
    chunks: Callable[[], Iterable[bytes]] | None = None,
    chunk_delay_s: float = 0.0,
) -> Behaviour:
    """Exactly these bytes, whatever the request asked: `status`, `headers` (a content-type of
    application/json unless given) and `body` — or, with `chunks`, a chunked body produced piece
    by piece as it is sent (so a gigabyte never sits in the fake's memory)."""
    return Behaviour(
        kind="raw",
        status=status,
        body=body,
        headers=headers or {},
        chunks=chunks,
        chunk_delay_s=chunk_delay_s,
    )


def replay(transcript: bytes) -> Behaviour:
    """A recorded answer, replayed byte for byte whatever the request asked: `transcript` is a
    status line, header lines, a blank line, then the body exactly as it was sent (an `.http` file
    of `tests/corpus`). A stream's body goes out event by event, each event one piece of a chunked
    body; any other body whole, with its length. Headers given twice are joined with ", "."""
    head, _, body = transcript.partition(b"\n\n")
    status_line, *lines = head.decode().split("\n")
    headers: dict[str, str] = {}
    for line in lines:
        name, _, value = line.partition(": ")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    kind = next((v for k, v in headers.items() if k.lower() == "content-type"), "")
    streamed = kind.startswith("text/event-stream")  # names as recorded: `Content-Type` too
    events = [piece for piece in re.split(rb"(?<=\n\n)", body) if piece]  # joined: the body
    return raw(
        int(status_line.split()[1]),
        body,
        headers=headers,
        chunks=(lambda: list(events)) if streamed else None,
    )


def quota(
    limit: int,
    *,
    window_s: float = 60.0,
    style: str = "openai",
    delay_s: float = 0.0,
    day_limit: int = 0,
) -> Behaviour:
    """Answer until `limit` requests in the current window, then 429 — reported the way `style`
    providers do: `openai` (x-ratelimit-*-requests, Go durations), `openrouter` (X-RateLimit-*,
    reset in epoch ms) or `gemini` (no headers; RetryInfo and QuotaFailure in the 429 body)."""
    return Behaviour(
        kind="quota",
        limit=limit,
        window_s=window_s,
        style=style,
        delay_s=delay_s,
        day_limit=day_limit,
    )


def hang() -> Behaviour:
    """Read the request, then never answer."""
    return Behaviour(kind="hang")


def reset() -> Behaviour:
    """Read the request, then reset the connection (RST)."""
    return Behaviour(kind="reset")


def status(code: int, body: Any = None, headers: Mapping[str, str] | None = None) -> Behaviour:
    if body is None:
        body = {"error": {"message": f"fake error {code}", "type": "fake", "code": str(code)}}
    return Behaviour(kind="status", status=code, body=body, headers=headers or {})


def rate_limited(
    *, retry_after: float | None = None, headers: Mapping[str, str] | None = None, body: Any = None
) -> Behaviour:
    merged = dict(headers or {})
    if retry_after is not None:
        merged["retry-after"] = f"{retry_after:g}"
    refused = {"error": {"message": "Rate limit reached", "code": "rate_limit_exceeded"}}
    return status(429, body or refused, merged)


def garbage() -> Behaviour:
    """A 200 whose body is not JSON (or, streamed, whose every event is not JSON)."""
    return Behaviour(kind="garbage")


def stream_cut(*, after: int = 2, clean: bool = False) -> Behaviour:
    """Send `after` chunks, then drop the connection (or, `clean`, end the body) with no finish."""
    return Behaviour(kind="cut", after=after, clean=clean)


def stream_stall(*, after: int = 2) -> Behaviour:
    """Send `after` chunks, then go silent with the connection open."""
    return Behaviour(kind="stall", after=after)


def malformed_chunk(*, after: int = 1) -> Behaviour:
    """A healthy stream with one non-JSON event after `after` chunks."""
    return Behaviour(kind="malformed", after=after)


def no_done() -> Behaviour:
    """A healthy stream that ends its body without the `[DONE]` sentinel."""
    return Behaviour(kind="no_done")


def quota_exceeded(b: Behaviour, reset_s: float, now_wall: float) -> Behaviour:
    """The 429 a `quota` behaviour answers once its window is used up, in its provider's style."""
    if b.style == "gemini":
        body = [
            {
                "error": {
                    "code": 429,
                    "status": "RESOURCE_EXHAUSTED",
                    "message": "You exceeded your current quota.",
                    "details": [
                        {
                            "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                            "violations": [
                                {"quotaId": "GenerateRequestsPerMinutePerProjectPerModel-FreeTier"}
                            ],
                        },
                        {
                            "@type": "type.googleapis.com/google.rpc.RetryInfo",
                            "retryDelay": f"{int(reset_s) + 1}s",
                        },
                    ],
                }
            }
        ]
        return status(429, body)
    headers = quota_headers(b, 0, reset_s, now_wall)
    if b.style == "openrouter":
        refused = {"error": {"message": "Rate limit exceeded: free-models-per-min", "code": 429}}
        return status(429, refused, headers)
    return rate_limited(retry_after=round(reset_s + 0.5), headers=headers)


def quota_headers(b: Behaviour, remaining: int, reset_s: float, now_wall: float) -> dict[str, str]:
    """The rate-limit headers a `quota` behaviour sends in its provider's style: `remaining`
    requests left in a window that resets in `reset_s` (gemini: none, it says so in the body)."""
    if b.style == "gemini":
        return {}
    if b.style == "openrouter":
        return {
            "X-RateLimit-Limit": str(b.limit),
            "X-RateLimit-Remaining": str(remaining),
            "X-RateLimit-Reset": str(int((now_wall + reset_s) * 1000)),
        }
    return {
        "x-ratelimit-limit-requests": str(b.limit),
        "x-ratelimit-remaining-requests": str(remaining),
        "x-ratelimit-reset-requests": f"{reset_s:.3f}s",
    }

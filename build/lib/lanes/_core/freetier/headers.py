"""The universal rate-limit parser: every provider's headers (and 429 bodies) into one snapshot.
Pure.

`parse_rate_limit(headers, *, status, body=None, now_wall)` never raises, whatever it is given.
Formats understood, case-insensitively:

- `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` (OpenAI-style), with optional
  `-minute/-hour/-day/-month` suffixes (Cerebras-style) and `req` for requests (Mistral-style);
  resets as Go durations (`6m0s`, `172.799999ms`), bare seconds, RFC 3339 or HTTP-dates;
- `x-ratelimit-{limit,remaining,reset}` (requests) and `x-tokenlimit-{limit,remaining}`;
- `<vendor>-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}`, a
  provider's own prefix before `ratelimit`;
- `ratelimitbysize-{limit,remaining,reset}` (tokens per minute);
- `retry-after-ms`, `x-ms-retry-after-ms` (-1 = no data), `retry-after` (seconds or any HTTP-date);
- IETF `RateLimit` / `RateLimit-Policy` structured fields and `RateLimit-{Limit,Remaining,Reset}`;
- bodies, filling only what headers lack: `RetryInfo.retryDelay` and `QuotaFailure` quota ids,
  `error.metadata.headers`, and prose such as "Please try again in 9.816s".

A bare epoch-like reset is judged by magnitude: >= 1e12 epoch ms, >= 1e9 epoch s, else seconds
from now. Absolute times in the past become 0. Bad values become None without spoiling the rest.
Every value is bounded where it enters: a wait or reset beyond `MAX_WAIT_S` (7 days) is clamped to
it, a limit or remaining count beyond `MAX_COUNT` too, and the snapshot names what was clamped
(`clamped`), so the caller can say so once.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Literal

import attrs

Dimension = Literal["requests", "tokens", "input_tokens", "output_tokens"]
MAX_WAIT_S = 7 * 86400.0  # no provider asks to be left alone longer; a larger figure is clamped
MAX_COUNT = 1e12  # no limit or remaining count is larger; a larger figure is clamped
WINDOWS_S = {
    "second": 1.0,
    "minute": 60.0,
    "min": 60.0,
    "hour": 3600.0,
    "day": 86400.0,
    "month": 2592000.0,
}


@attrs.frozen(kw_only=True)
class Window:
    """One limit window a provider reported. `window_s` None when the provider does not say."""

    dimension: Dimension
    window_s: float | None = None
    limit: float | None = None
    remaining: float | None = None
    reset_s: float | None = None


@attrs.frozen(kw_only=True)
class RateLimitSnapshot:
    """What one response said about limits. Every field None when unknown; times in seconds from
    now."""

    requests_remaining: float | None = None
    requests_limit: float | None = None
    tokens_remaining: float | None = None
    tokens_limit: float | None = None
    reset_requests_s: float | None = None
    reset_tokens_s: float | None = None
    retry_after_s: float | None = None
    windows: tuple[Window, ...] = ()
    # the body named the exhausted quota's window (per day...)
    exhausted_window_s: float | None = None
    clamped: tuple[str, ...] = ()  # what was out of bounds and clamped ("retry-after", ...)

    @property
    def empty(self) -> bool:
        return self.retry_after_s is None and not self.windows and self.exhausted_window_s is None


# -- scalar parsers: each returns None for anything it can not read --------------------------------

_GO = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(h|ms|m|s|us|µs|ns)")
_GO_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def number(value: Any) -> float | None:
    """A finite, non-negative number, or None (negative, NaN, infinite, empty, junk)."""
    try:
        result = float(str(value).strip())
    except (TypeError, ValueError):
        return None
    return result if math.isfinite(result) and result >= 0 else None


def go_duration(text: str) -> float | None:
    """Seconds in a Go-style duration (`1h2m3.5s`, `172.799999ms`) or None."""
    text = text.strip()
    if not text:
        return None
    pos, total = 0, 0.0
    for match in _GO.finditer(text):
        if match.start() != pos:
            return None
        total += float(match.group(1)) * _GO_UNITS[match.group(2)]
        pos = match.end()
    return total if pos == len(text) and pos > 0 and math.isfinite(total) else None


def _date(text: str) -> datetime | None:
    text = text.strip()
    if not text or text[0].isdigit() and len(text) < 8:
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        try:
            parsed = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def seconds_until(value: Any, now_wall: float, *, epoch_by_magnitude: bool = True) -> float | None:
    """Seconds from now for a reset written as a duration, bare seconds, epoch s/ms or a date."""
    text = str(value).strip() if value is not None else ""
    if not text:
        return None
    plain = number(text)
    if plain is not None:
        if epoch_by_magnitude and plain >= 1e12:
            return max(0.0, plain / 1000.0 - now_wall)
        if epoch_by_magnitude and plain >= 1e9:
            return max(0.0, plain - now_wall)
        return plain
    duration = go_duration(text)
    if duration is not None:
        return duration
    moment = _date(text)
    if moment is None:
        return None
    try:
        return max(0.0, moment.timestamp() - now_wall)
    except (OverflowError, OSError, ValueError):
        return None


def clamp(value: float | None, high: float, what: str, clamped: list[str]) -> float | None:
    """`value` capped at `high`; `what` is noted in `clamped` when it was over."""
    if value is not None and value > high:
        clamped.append(what)
        return high
    return value


# -- header families -------------------------------------------------------------------------------

_OPENAI = re.compile(
    r"^x-ratelimit-(limit|remaining|reset)-(requests|request|req|tokens|token)(?:-(second|minute|min|hour|day|month))?$"
)
_MISTRAL_ORDER = re.compile(
    r"^x-ratelimit-(limit|remaining|reset)-(tokens|req|requests)-(minute|hour|day|month)$"
)
_VENDOR = re.compile(
    r"^[a-z][a-z0-9]*-ratelimit-(requests|tokens|input-tokens|output-tokens)-(limit|remaining|reset)$"
)
_DIMENSIONS: dict[str, Dimension] = {
    "requests": "requests",
    "request": "requests",
    "req": "requests",
    "tokens": "tokens",
    "token": "tokens",
    "input-tokens": "input_tokens",
    "output-tokens": "output_tokens",
}


class _Builder:
    """Collects (dimension, window) → fields while headers are read."""

    def __init__(self, now_wall: float) -> None:
        self.now_wall = now_wall
        self.slots: dict[tuple[Dimension, float | None], dict[str, float | None]] = {}
        self.clamped: list[str] = []

    def put(
        self,
        dimension: Dimension,
        window_s: float | None,
        field: str,
        raw: Any,
        *,
        epoch: bool = True,
    ) -> None:
        value = (
            seconds_until(raw, self.now_wall, epoch_by_magnitude=epoch)
            if field == "reset"
            else number(raw)
        )
        value = clamp(
            value,
            MAX_WAIT_S if field == "reset" else MAX_COUNT,
            f"{dimension} {field}",
            self.clamped,
        )
        slot = self.slots.setdefault((dimension, window_s), {})
        if value is not None or field not in slot:
            slot[field] = value

    def windows(self) -> tuple[Window, ...]:
        out = []
        for (dimension, window_s), fields in self.slots.items():
            if all(v is None for v in fields.values()):
                continue
            out.append(
                Window(
                    dimension=dimension,
                    window_s=window_s,
                    limit=fields.get("limit"),
                    remaining=fields.get("remaining"),
                    reset_s=fields.get("reset"),
                )
            )
        return tuple(
            sorted(out, key=lambda w: (w.dimension, w.window_s is None, w.window_s or 0.0))
        )


#: A header's place in a snapshot, as its name alone says: (dimension, window seconds — or
#: `_CONVENTION` for the provider's convention for that dimension — field, reset read as an epoch
#: by its magnitude?).
_Slot = tuple[Dimension, Any, str, bool]
_CONVENTION = object()


@functools.lru_cache(maxsize=1024)
def _slot_of(name: str) -> _Slot | None:
    """Where a (lower-case) header name's value goes, or None for a name that says no rate limit:
    worked out once per name (the names a provider sends are few; their values change)."""
    if "limit" not in name:  # every name below says ratelimit or tokenlimit
        return None
    if match := _VENDOR.match(name):
        return _DIMENSIONS[match.group(1)], None, match.group(2), True
    if match := _MISTRAL_ORDER.match(name):
        field, dimension, window = match.groups()
        return _DIMENSIONS[dimension], WINDOWS_S[window], field, True
    if match := _OPENAI.match(name):
        field, dimension, window = match.groups()
        return _DIMENSIONS[dimension], WINDOWS_S[window] if window else _CONVENTION, field, True
    if name in ("x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"):
        return "requests", _CONVENTION, name.rsplit("-", 1)[1], True
    if name in ("x-tokenlimit-limit", "x-tokenlimit-remaining"):
        return "tokens", _CONVENTION, name.rsplit("-", 1)[1], True
    if name in ("ratelimitbysize-limit", "ratelimitbysize-remaining", "ratelimitbysize-reset"):
        return "tokens", 60.0, name.rsplit("-", 1)[1], True
    if name in ("ratelimit-limit", "ratelimit-remaining", "ratelimit-reset"):
        return "requests", None, name.rsplit("-", 1)[1], False
    return None


def _read_headers(
    headers: Mapping[str, str], builder: _Builder, conventions: Mapping[str, float]
) -> None:
    for name, value in headers.items():
        slot = _slot_of(name) if "limit" in name else None
        if slot is None:
            continue
        dimension, window, field, epoch = slot
        if window is _CONVENTION:
            window = conventions.get(dimension)
        builder.put(dimension, window, field, value, epoch=epoch)
    _read_ietf(headers, builder)


_PARAM = re.compile(r'([a-z]+)=("?)([^",;\s]*)\2')


def _read_ietf(headers: Mapping[str, str], builder: _Builder) -> None:
    """`RateLimit: limit=100, remaining=5, reset=30` or `RateLimit: "p";r=5;t=30` +
    `RateLimit-Policy: "p";q=100;w=60`."""
    field = headers.get("ratelimit")
    if not field:
        return
    params = dict((k, v) for k, _, v in _PARAM.findall(field))
    policy = dict((k, v) for k, _, v in _PARAM.findall(headers.get("ratelimit-policy", "")))
    window = number(policy.get("w")) if policy.get("w") else None
    limit = params.get("limit", policy.get("q"))
    remaining = params.get("remaining", params.get("r"))
    reset = params.get("reset", params.get("t"))
    for name, value in (("limit", limit), ("remaining", remaining), ("reset", reset)):
        if value is not None:
            builder.put("requests", window, name, value, epoch=name != "reset")


def _retry_after(headers: Mapping[str, str], now_wall: float) -> float | None:
    for name in ("retry-after-ms", "x-ms-retry-after-ms"):
        value = number(headers.get(name))
        if value is not None:
            return value / 1000.0
    raw = headers.get("retry-after")
    return None if raw is None else seconds_until(raw, now_wall, epoch_by_magnitude=False)


# -- bodies ---------------------------------------------------------------------------------------

_PROSE = re.compile(
    r"(?:try again|retry|wait)\s+(?:in|after)\s+"
    r"((?:\d+(?:\.\d+)?\s*(?:h|ms|m|s|us)\s*)+|\d+(?:\.\d+)?\s*"
    r"(?:seconds?|secs?|minutes?|mins?|hours?))",
    re.IGNORECASE,
)
_PROSE_UNITS = {"sec": 1.0, "second": 1.0, "min": 60.0, "minute": 60.0, "hour": 3600.0}


def _body_json(body: Any) -> Any:
    if isinstance(body, (bytes, bytearray)):
        body = bytes(body).decode("utf-8", "replace")
    if isinstance(body, str):
        try:
            return json.loads(body)
        except ValueError:
            return body
    return body


def _walk(value: Any, depth: int = 0) -> Iterable[Any]:
    if depth > 6:
        return
    yield value
    if isinstance(value, Mapping):
        for child in value.values():
            yield from _walk(child, depth + 1)
    elif isinstance(value, list):
        for child in value[:50]:
            yield from _walk(child, depth + 1)


def _prose_seconds(text: str) -> float | None:
    match = _PROSE.search(text)
    if not match:
        return None
    amount = match.group(1).replace(" ", "")
    duration = go_duration(amount)
    if duration is not None:
        return duration
    unit = re.match(r"(\d+(?:\.\d+)?)([a-z]+)", amount.lower())
    if not unit:
        return None
    scale = next(
        (s for prefix, s in _PROSE_UNITS.items() if unit.group(2).startswith(prefix)), None
    )
    return float(unit.group(1)) * scale if scale else None


def _read_body(body: Any, now_wall: float) -> tuple[float | None, float | None, dict[str, str]]:
    """(retry_after_s, exhausted_window_s, embedded headers) from a 429 body."""
    parsed = _body_json(body)
    retry, window, embedded = None, None, {}
    for node in _walk(parsed):
        if isinstance(node, Mapping):
            kind = str(node.get("@type", ""))
            if kind.endswith("RetryInfo") and retry is None:
                retry = seconds_until(
                    node.get("retryDelay", ""), now_wall, epoch_by_magnitude=False
                )
            quota_id = str(node.get("quotaId", "")) + " " + str(node.get("quotaMetric", ""))
            lowered = quota_id.lower()
            for word, seconds in (
                ("perday", 86400.0),
                ("perminute", 60.0),
                ("perhour", 3600.0),
                ("permonth", 2592000.0),
            ):
                if word in lowered:
                    window = max(window or 0.0, seconds)
            meta = node.get("metadata")
            if isinstance(meta, Mapping) and isinstance(meta.get("headers"), Mapping):
                embedded = {str(k).lower(): str(v) for k, v in meta["headers"].items()}
        elif isinstance(node, str) and retry is None:
            retry = _prose_seconds(node)
    return retry, window, embedded


# -- the parser ----------------------------------------------------------------------------------


def _normalise(headers: Any) -> dict[str, str]:
    if type(headers) is dict:  # what the upstream client hands over: text names and values
        fast: dict[str, str] = {}
        for name, value in headers.items():
            if type(name) is not str or type(value) is not str:
                break  # something else in it: the careful way below
            fast[name.strip().lower()] = value.strip()
        else:
            return fast
    items = (
        headers.items()
        if isinstance(headers, Mapping)
        else headers
        if isinstance(headers, (list, tuple))
        else ()
    )
    out: dict[str, str] = {}
    for item in items:
        try:
            name, value = item
        except (TypeError, ValueError):
            continue
        if isinstance(name, bytes):
            name = name.decode("latin-1")
        if isinstance(value, bytes):
            value = value.decode("latin-1")
        if isinstance(name, str) and value is not None:
            out[name.strip().lower()] = str(value).strip()
    return out


def _shortest(windows: tuple[Window, ...], dimension: str) -> Window | None:
    found = [w for w in windows if w.dimension == dimension]
    return found[0] if found else None  # sorted: known windows first, shortest first


def snapshot_of(
    windows: tuple[Window, ...], *, retry_after_s: float | None, **more: Any
) -> RateLimitSnapshot:
    """The snapshot of `windows` (sorted: known windows first, shortest first): each dimension's
    summary read off its shortest window — as parsed, and as read back from a store."""
    requests, tokens = _shortest(windows, "requests"), _shortest(windows, "tokens")
    return RateLimitSnapshot(
        requests_remaining=requests.remaining if requests else None,
        requests_limit=requests.limit if requests else None,
        tokens_remaining=tokens.remaining if tokens else None,
        tokens_limit=tokens.limit if tokens else None,
        reset_requests_s=requests.reset_s if requests else None,
        reset_tokens_s=tokens.reset_s if tokens else None,
        retry_after_s=retry_after_s,
        windows=windows,
        **more,
    )


def parse_rate_limit(
    headers: Any,
    *,
    status: int | None,
    body: Any = None,
    now_wall: float,
    conventions: Mapping[str, float] | None = None,
) -> RateLimitSnapshot:
    """Everything a response says about rate limits. Never raises.

    `now_wall` is the wall-clock epoch in seconds (for dates and epoch resets). `conventions` maps
    a dimension to its window length where a provider's unsuffixed headers imply one (for example
    requests per day and tokens per minute).
    """
    try:
        return _parse(headers, status, body, now_wall, conventions or {})
    except Exception:  # the contract is totality: a parser bug must never break a request
        return RateLimitSnapshot()


def _parse(
    headers: Any, status: int | None, body: Any, now_wall: float, conventions: Mapping[str, float]
) -> RateLimitSnapshot:
    lower = _normalise(headers)
    retry_body, exhausted_window, embedded = (None, None, dict[str, str]())
    if body is not None and (status is None or status >= 400):
        retry_body, exhausted_window, embedded = _read_body(body, now_wall)
    merged = {**embedded, **lower}  # real headers win over ones echoed in a body
    builder = _Builder(now_wall)
    _read_headers(merged, builder, conventions)
    windows = builder.windows()
    retry = clamp(_retry_after(merged, now_wall), MAX_WAIT_S, "retry-after", builder.clamped)
    if retry is None:
        retry = clamp(retry_body, MAX_WAIT_S, "retry delay in the body", builder.clamped)
    return snapshot_of(
        windows,
        retry_after_s=retry,
        exhausted_window_s=exhausted_window,
        clamped=tuple(dict.fromkeys(builder.clamped)),
    )

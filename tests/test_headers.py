"""The universal rate-limit parser: a table of real-shaped cases per provider, and totality."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lanes._core.freetier.headers import _parse, go_duration, parse_rate_limit

NOW = 1_764_000_000.0  # 2025-11-24T16:00:00Z, the wall clock in these cases


def parse(headers, status=200, body=None, **kw):
    return parse_rate_limit(headers, status=status, body=body, now_wall=NOW, **kw)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1s", 1.0),
        ("6m0s", 360.0),
        ("2m59.56s", 179.56),
        ("172.799999ms", 0.172799999),
        ("1h2m3.5s", 3723.5),
        ("500us", 0.0005),
        ("", None),
        ("5x", None),
        ("m", None),
        ("1.5", None),
    ],
)
def test_go_durations(text, seconds):
    """Go-style durations in every unit, and junk refused."""
    assert go_duration(text) == (pytest.approx(seconds) if seconds is not None else None)


def test_openai_and_groq_style():
    """OpenAI-style headers; Groq's conventions make requests per day and tokens per minute."""
    headers = {
        "x-ratelimit-limit-requests": "14400",
        "x-ratelimit-remaining-requests": "14370",
        "x-ratelimit-reset-requests": "2m59.56s",
        "x-ratelimit-limit-tokens": "6000",
        "x-ratelimit-remaining-tokens": "5997",
        "x-ratelimit-reset-tokens": "7.66s",
    }
    snap = parse(headers, conventions={"requests": 86400.0, "tokens": 60.0})
    assert (
        snap.requests_limit,
        snap.requests_remaining,
        snap.tokens_limit,
        snap.tokens_remaining,
    ) == (14400, 14370, 6000, 5997)
    assert snap.reset_requests_s == pytest.approx(179.56) and snap.reset_tokens_s == pytest.approx(
        7.66
    )
    assert any(
        (w.dimension, w.window_s, w.limit, w.remaining) == ("requests", 86400.0, 14400, 14370)
        and w.reset_s == pytest.approx(179.56)
        for w in snap.windows
    )
    assert parse(headers).windows[0].window_s is None  # without conventions, the window is unknown


def test_case_insensitive():
    """Header names are matched whatever their case."""
    snap = parse({"X-RateLimit-Remaining-Requests": "3", "X-RATELIMIT-LIMIT-REQUESTS": "10"})
    assert (snap.requests_remaining, snap.requests_limit) == (3, 10)


def test_cerebras_suffixes_keep_every_window_and_report_the_shortest():
    """-minute and -day windows are both kept; top-level fields describe the shortest."""
    snap = parse(
        {
            "x-ratelimit-limit-requests-day": "14400",
            "x-ratelimit-remaining-requests-day": "14399",
            "x-ratelimit-reset-requests-day": "33011.382867",
            "x-ratelimit-limit-tokens-minute": "60000",
            "x-ratelimit-remaining-tokens-minute": "59000",
            "x-ratelimit-reset-tokens-minute": "11.38",
            "x-ratelimit-limit-requests-minute": "30",
            "x-ratelimit-remaining-requests-minute": "29",
        }
    )
    assert (snap.requests_limit, snap.requests_remaining) == (30, 29)
    assert {(w.dimension, w.window_s) for w in snap.windows} == {
        ("requests", 60.0),
        ("requests", 86400.0),
        ("tokens", 60.0),
    }
    day = next(w for w in snap.windows if w.window_s == 86400.0)
    assert day.reset_s == pytest.approx(33011.382867)


def test_together():
    """Bare x-ratelimit-* are requests; x-tokenlimit-* are tokens."""
    snap = parse(
        {
            "x-ratelimit-limit": "3",
            "x-ratelimit-remaining": "0",
            "x-ratelimit-reset": "20",
            "x-tokenlimit-limit": "60000",
            "x-tokenlimit-remaining": "59000",
        }
    )
    assert (snap.requests_limit, snap.requests_remaining, snap.reset_requests_s) == (3, 0, 20)
    assert (snap.tokens_limit, snap.tokens_remaining) == (60000, 59000)


def test_anthropic_rfc3339_resets():
    """Anthropic's dimensions, with RFC 3339 resets turned into seconds from now."""
    snap = parse(
        {
            "anthropic-ratelimit-requests-limit": "50",
            "anthropic-ratelimit-requests-remaining": "49",
            "anthropic-ratelimit-requests-reset": "2025-11-24T16:00:30Z",
            "anthropic-ratelimit-input-tokens-remaining": "39000",
            "anthropic-ratelimit-tokens-reset": "2025-11-24T15:59:00Z",  # in the past
        }
    )
    assert (snap.requests_remaining, snap.reset_requests_s) == (49, 30.0)
    assert snap.reset_tokens_s == 0.0
    assert any(w.dimension == "input_tokens" and w.remaining == 39000 for w in snap.windows)


def test_openrouter_epoch_ms_and_body_headers():
    """X-RateLimit-Reset in epoch ms; a 429 body's error.metadata.headers fills headers' gaps."""
    reset_ms = int((NOW + 45) * 1000)
    snap = parse(
        {
            "X-RateLimit-Limit": "20",
            "X-RateLimit-Remaining": "0",
            "X-RateLimit-Reset": str(reset_ms),
        }
    )
    assert (snap.requests_limit, snap.requests_remaining) == (20, 0)
    assert snap.reset_requests_s == pytest.approx(45)
    body = {
        "error": {
            "message": "Rate limit exceeded: free-models-per-day",
            "code": 429,
            "metadata": {
                "headers": {
                    "X-RateLimit-Limit": "50",
                    "X-RateLimit-Remaining": "0",
                    "X-RateLimit-Reset": str(reset_ms),
                }
            },
        }
    }
    from_body = parse({}, status=429, body=json.dumps(body))
    assert (from_body.requests_limit, from_body.requests_remaining) == (50, 0)


def test_mistral_and_ratelimitbysize():
    """Mistral's -tokens-minute/-month and -req-minute; older ratelimitbysize-* as tokens/minute."""
    snap = parse(
        {
            "x-ratelimit-limit-tokens-minute": "500000",
            "x-ratelimit-remaining-tokens-minute": "499000",
            "x-ratelimit-remaining-tokens-month": "999000000",
            "x-ratelimit-limit-req-minute": "60",
            "x-ratelimit-remaining-req-minute": "59",
        }
    )
    assert (snap.tokens_remaining, snap.requests_remaining, snap.requests_limit) == (499000, 59, 60)
    assert any(w.window_s == 2592000.0 and w.remaining == 999000000 for w in snap.windows)
    older = parse(
        {
            "ratelimitbysize-limit": "2000000",
            "ratelimitbysize-remaining": "1999000",
            "ratelimitbysize-reset": "12",
        }
    )
    assert (older.tokens_limit, older.tokens_remaining, older.reset_tokens_s) == (
        2000000,
        1999000,
        12,
    )


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "30"}, 30.0),
        ({"retry-after": "Mon, 24 Nov 2025 16:01:00 GMT"}, 60.0),  # IMF-fixdate
        ({"retry-after": "Monday, 24-Nov-25 16:01:00 GMT"}, 60.0),  # RFC 850
        ({"retry-after": "Mon Nov 24 16:01:00 2025"}, 60.0),  # asctime
        ({"retry-after": "Mon, 24 Nov 2025 15:00:00 GMT"}, 0.0),  # in the past
        ({"retry-after": "30", "retry-after-ms": "1500"}, 1.5),  # -ms preferred
        ({"x-ms-retry-after-ms": "250"}, 0.25),
        ({"retry-after-ms": "-1"}, None),  # Azure's "no data"
        ({"retry-after": "soon"}, None),
        ({"retry-after": "-5"}, None),
        ({"retry-after": "NaN"}, None),
        ({"retry-after": "inf"}, None),
        ({"retry-after": ""}, None),
        ({"retry-after": "0"}, 0.0),  # a valid zero
    ],
)
def test_retry_after_forms(headers, expected):
    """Retry-After as seconds or any HTTP-date form, -ms variants, and junk."""
    assert parse(headers, status=429).retry_after_s == expected


def test_ietf_structured_fields():
    """Both IETF drafts: the structured RateLimit/RateLimit-Policy pair and older split headers."""
    snap = parse({"RateLimit": '"default";r=5;t=30', "RateLimit-Policy": '"default";q=100;w=60'})
    assert (snap.requests_limit, snap.requests_remaining, snap.reset_requests_s) == (100, 5, 30)
    assert snap.windows[0].window_s == 60
    older = parse({"RateLimit": "limit=10, remaining=0, reset=7"})
    assert (older.requests_limit, older.requests_remaining, older.reset_requests_s) == (10, 0, 7)
    split = parse({"RateLimit-Limit": "100", "RateLimit-Remaining": "99", "RateLimit-Reset": "50"})
    assert (split.requests_limit, split.requests_remaining, split.reset_requests_s) == (100, 99, 50)


def test_bare_reset_by_magnitude():
    """A bare X-RateLimit-Reset >= 1e12 is epoch ms, >= 1e9 epoch s, else seconds from now."""
    assert parse({"x-ratelimit-reset": str(NOW + 10)}).reset_requests_s == pytest.approx(10)
    assert parse({"x-ratelimit-reset": str((NOW + 10) * 1000)}).reset_requests_s == pytest.approx(
        10
    )
    assert parse({"x-ratelimit-reset": "10"}).reset_requests_s == 10
    assert parse({"x-ratelimit-reset": str(NOW - 100)}).reset_requests_s == 0.0


def test_gemini_body_retry_info_and_quota_window():
    """Gemini's 429: RetryInfo.retryDelay and a per-day QuotaFailure id."""
    body = [
        {
            "error": {
                "code": 429,
                "message": "You exceeded your current quota",
                "status": "RESOURCE_EXHAUSTED",
                "details": [
                    {
                        "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                        "violations": [
                            {
                                "quotaMetric": (
                                    "generativelanguage.googleapis.com/"
                                    "generate_content_free_tier_requests"
                                ),
                                "quotaId": "GenerateRequestsPerDayPerProjectPerModel-FreeTier",
                            }
                        ],
                    },
                    {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "36s"},
                ],
            }
        }
    ]
    snap = parse({}, status=429, body=json.dumps(body).encode())
    assert snap.retry_after_s == 36.0 and snap.exhausted_window_s == 86400.0
    minute = parse(
        {},
        status=429,
        body={
            "error": {
                "details": [
                    {
                        "@type": "x.QuotaFailure",
                        "violations": [
                            {"quotaId": "GenerateRequestsPerMinutePerProjectPerModel-FreeTier"}
                        ],
                    }
                ]
            }
        },
    )
    assert minute.exhausted_window_s == 60.0 and minute.retry_after_s is None


@pytest.mark.parametrize(
    ("message", "seconds"),
    [
        ("Rate limit reached for model. Please try again in 9.816s.", 9.816),
        ("Please try again in 1m30s", 90.0),
        ("Please try again in 2m59.56s. Visit https://x", 179.56),
        ("Too many requests, retry after 20 seconds", 20.0),
        ("wait in 3 minutes", 180.0),
        ("no hint here", None),
    ],
)
def test_prose_in_bodies(message, seconds):
    """'Please try again in …' prose fills retry_after when no header gives it."""
    snap = parse({}, status=429, body={"error": {"message": message}})
    assert snap.retry_after_s == (pytest.approx(seconds) if seconds is not None else None)


def test_headers_win_over_bodies():
    """A retry-after header beats a body's retry delay."""
    snap = parse(
        {"retry-after": "5"}, status=429, body={"error": {"message": "Please try again in 60s"}}
    )
    assert snap.retry_after_s == 5


def test_bad_values_do_not_spoil_the_rest():
    """A junk limit becomes None while its neighbours are still read."""
    snap = parse(
        {
            "x-ratelimit-limit-requests": "lots",
            "x-ratelimit-remaining-requests": "7",
            "x-ratelimit-remaining-tokens": "-3",
            "x-ratelimit-limit-tokens": "1e400",
        }
    )
    assert (snap.requests_limit, snap.requests_remaining) == (None, 7)
    assert (snap.tokens_remaining, snap.tokens_limit) == (None, None)


def test_nothing_known_is_empty():
    """No limit headers: every field None and the snapshot empty."""
    snap = parse({"content-type": "application/json"})
    assert snap.empty and snap.requests_remaining is None and snap.windows == ()


header_names = st.sampled_from(
    [
        "retry-after",
        "retry-after-ms",
        "x-ms-retry-after-ms",
        "x-ratelimit-reset",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-reset-tokens-minute",
        "anthropic-ratelimit-requests-reset",
        "ratelimit",
        "ratelimit-policy",
        "x-tokenlimit-limit",
        "ratelimitbysize-reset",
        "x-ratelimit-limit-req-minute",
    ]
) | st.text(max_size=30)
values = (
    st.text(max_size=40)
    | st.integers().map(str)
    | st.floats(allow_nan=True, allow_infinity=True).map(str)
)
bodies = (
    st.none()
    | st.text(max_size=80)
    | st.binary(max_size=80)
    | st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=20),
        lambda c: (
            st.lists(c, max_size=3)
            | st.dictionaries(
                st.sampled_from(
                    [
                        "error",
                        "details",
                        "@type",
                        "retryDelay",
                        "quotaId",
                        "metadata",
                        "headers",
                        "message",
                    ]
                )
                | st.text(max_size=5),
                c,
                max_size=4,
            )
        ),
        max_leaves=12,
    )
)


@given(
    st.dictionaries(header_names, values, max_size=8),
    st.integers(0, 999) | st.none(),
    bodies,
    st.floats(min_value=0, max_value=4e9),
)
def test_never_raises(headers, status, body, now):
    """Arbitrary header maps and bodies never raise — checked below the last-resort guard."""
    snap = _parse(headers, status, body, now, {})
    for value in (
        snap.requests_remaining,
        snap.tokens_remaining,
        snap.retry_after_s,
        snap.reset_requests_s,
    ):
        assert value is None or value >= 0


def test_odd_header_containers_never_raise():
    """Lists of pairs, bytes, junk items and non-mappings are all tolerated."""
    assert parse([(b"Retry-After", b"3"), ("x",), None], status=429).retry_after_s == 3
    assert parse(None).empty and parse(42).empty

"""Backoff ladders, windows and the manager's decisions as pure functions of `now`."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from helpers import examples
from lanes._core.freetier.backoff import CREDIT_LADDER_S, RATE_LADDER_S, backoff_for
from lanes._core.freetier.headers import RateLimitSnapshot, Window
from lanes._core.freetier.kinds import CreditBased, FreeModelsOnly, NoFreeTier, RateLimitedFree
from lanes._core.freetier.manager import FreeTierManager, LaneTerms
from lanes._core.freetier.prices import usage_cost
from lanes._core.freetier.windows import UsageCounter, window_end, window_id

NOW = 1_764_000_000.0  # 2025-11-24T16:00:00Z
EMPTY = RateLimitSnapshot()


def no_jitter() -> float:
    return 0.0


def test_ladders_without_headers():
    """No header: 1, 2, 4 … 60 s for rate limits; 5 min … 24 h for credits; capped at the top."""
    rate = [
        backoff_for("rate_limited", EMPTY, step=i, now=NOW, random=no_jitter).until - NOW
        for i in range(9)
    ]
    credit = [
        backoff_for("credit_exhausted", EMPTY, step=i, now=NOW, random=no_jitter).until - NOW
        for i in range(6)
    ]
    assert rate == [*RATE_LADDER_S, 60.0, 60.0]
    assert credit == [*CREDIT_LADDER_S, 86400.0]


def test_retry_after_beats_reset_beats_ladder():
    """retry-after first, then the exhausted window's reset, then the ladder."""
    reset_only = RateLimitSnapshot(
        windows=(Window(dimension="requests", remaining=0, reset_s=12.0),)
    )
    both = RateLimitSnapshot(retry_after_s=3.0, windows=reset_only.windows)
    assert backoff_for("rate_limited", both, step=5, now=NOW, random=no_jitter).until == NOW + 3
    assert (
        backoff_for("rate_limited", reset_only, step=5, now=NOW, random=no_jitter).source
        == "reset header"
    )


def test_daily_quota_parks_until_the_window_resets():
    """A per-day 429 with a short retry delay still parks until UTC midnight."""
    gemini_daily = RateLimitSnapshot(retry_after_s=36.0, exhausted_window_s=86400.0)
    backoff = backoff_for("rate_limited", gemini_daily, step=0, now=NOW, random=no_jitter)
    assert backoff.until == window_end("day", NOW) and backoff.source == "daily window"


@given(st.floats(0, 1, exclude_max=True), st.integers(0, 10), st.floats(0, 1000))
def test_jitter_is_positive_and_bounded(draw, step, retry):
    """Jitter only lengthens a backoff, by at most 10 % (+5 % of a second)."""
    snap = RateLimitSnapshot(retry_after_s=retry)
    until = backoff_for("rate_limited", snap, step=step, now=NOW, random=lambda: draw).until
    assert NOW + retry <= until <= NOW + retry * 1.1 + 0.05 + 1e-6


def test_windows_have_utc_boundaries():
    """Minute, day and month windows end on UTC boundaries."""
    assert window_end("minute", NOW + 1) == NOW + 60
    assert window_end("day", NOW) == 1_764_028_800.0  # 2025-11-25T00:00Z
    assert window_end("month", NOW) == 1_764_547_200.0  # 2025-12-01T00:00Z
    assert window_id("month", NOW) == 2025 * 12 + 10


def test_counter_rolls_over_with_the_window():
    """Counts belong to their window: a new minute starts from zero, the day keeps counting."""
    counter = UsageCounter()
    counter.add("g/m", NOW, requests=3, tokens=100)
    counter.add("g/m", NOW + 61, requests=1)
    assert counter.used("g/m", "requests", "minute", NOW + 61) == 1
    assert counter.used("g/m", "requests", "day", NOW + 61) == 4
    assert counter.used("g/m", "tokens", "day", NOW) == 100


def manager(kind) -> FreeTierManager:
    m = FreeTierManager(random=no_jitter)
    m.register("g", LaneTerms(kind=kind))
    return m


def test_local_counting_when_headers_are_silent():
    """With no headers, rpm is enforced from our own counts until the minute ends."""
    m = manager(RateLimitedFree(rpm=2))
    for _ in range(2):
        assert m.classify("g", "m", NOW).free
        m.count_usage("g", "m", now=NOW)
    verdict = m.classify("g", "m", NOW + 1)
    assert not verdict.free and verdict.free_again_at == window_end("minute", NOW)
    assert m.classify("g", "m", window_end("minute", NOW)).free


def test_header_values_beat_local_counts():
    """A provider saying 100 remaining wins over our count of the configured rpm=2."""
    m = manager(RateLimitedFree(rpm=2))
    for _ in range(3):
        m.count_usage("g", "m", now=NOW)
        m.update_from_headers(
            "g",
            "m",
            {
                "x-ratelimit-remaining-requests-minute": "100",
                "x-ratelimit-reset-requests-minute": "30",
            },
            status=200,
            now=NOW,
        )
    assert m.classify("g", "m", NOW).free


def test_remaining_zero_parks_before_any_429():
    """A 200 whose headers say remaining 0 parks the candidate until that window's reset."""
    m = manager(RateLimitedFree())
    m.update_from_headers(
        "g",
        "m",
        {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "7s"},
        status=200,
        now=NOW,
    )
    verdict = m.classify("g", "m", NOW)
    assert not verdict.free and verdict.free_again_at == NOW + 7


def test_a_new_backoff_never_shortens_a_longer_one():
    """A short retry-after arriving during a long backoff leaves the long one in force."""
    m = manager(RateLimitedFree())
    m.back_off("g", "m", "rate_limited", headers={"retry-after": "100"}, now=NOW)
    m.back_off("g", "m", "rate_limited", headers={"retry-after": "2"}, now=NOW + 1)
    backoff = m.is_in_backoff("g", "m", NOW + 50)
    assert backoff is not None and backoff.until == NOW + 100


def test_account_wide_limits_park_every_model():
    """For an account-wide limit (OpenRouter's free models) one 429 parks the whole lane."""
    m = manager(FreeModelsOnly())
    m.back_off("g", "a:free", "rate_limited", headers={"retry-after": "10"}, now=NOW)
    assert not m.classify("g", "b:free", NOW).free
    assert (
        m.classify("g", "b", NOW).kind == "not_free"
        and m.classify("g", "b", NOW).reason == "paid model"
    )


def test_credit_exhaustion_takes_the_long_ladder():
    """402s climb 5 min, 15 min, 1 h … not the seconds ladder."""
    m = manager(CreditBased(budget_usd=5))
    durations = []
    now = NOW
    for _ in range(3):
        backoff = m.back_off("g", "m", "credit_exhausted", status=402, now=now)
        durations.append(backoff.until - now)
        now = backoff.until
    assert durations == [300.0, 900.0, 3600.0]


def test_credit_estimate_and_provider_balance():
    """Spend is estimated from usage × price (as the paid gate settles it); a balance from the
    provider wins over the estimate."""
    m = manager(CreditBased(budget_usd=1.0, reset="daily"))
    usage = {"prompt_tokens": 600_000, "completion_tokens": 400_000, "total_tokens": 1_000_000}
    m.settle_credit("g", 0.0, usage_cost(usage, 1.0, 1.0) or 0.0, NOW)
    assert m.credit_left("g", NOW) == pytest.approx(0.0)
    assert not m.classify("g", "m", NOW).free
    assert m.classify("g", "m", NOW).free_again_at == window_end("day", NOW)
    m.set_balance("g", 3.0, now=NOW)
    assert m.credit_left("g", NOW) == pytest.approx(3.0) and m.classify("g", "m", NOW).free


def test_model_gone_gets_its_own_long_cooldown():
    """404 parks the model for 30 min, then 1 h."""
    m = manager(RateLimitedFree())
    first = m.back_off("g", "m", "model_gone", status=404, now=NOW)
    second = m.back_off("g", "m", "model_gone", status=404, now=first.until)
    assert (first.until - NOW, second.until - first.until) == (1800.0, 3600.0)


def test_next_free_at_names_the_soonest():
    """next_free_at gives the soonest reopening among not-free candidates, and which one."""
    m = FreeTierManager(random=no_jitter)
    m.register("a", LaneTerms(kind=RateLimitedFree()))
    m.register("b", LaneTerms(kind=RateLimitedFree()))
    m.register("p", LaneTerms(kind=NoFreeTier()))
    m.back_off("a", "x", "rate_limited", headers={"retry-after": "30"}, now=NOW)
    m.back_off("b", "y", "rate_limited", headers={"retry-after": "12"}, now=NOW)
    assert m.next_free_at([("a", "x"), ("b", "y"), ("p", "z")], NOW) == (NOW + 12, "b/y")


def test_a_quiet_expiry_halves_the_step():
    """After a backoff expires and a success follows, the next 429 starts lower on the ladder."""
    m = manager(RateLimitedFree())
    now = NOW
    for _ in range(4):
        now = m.back_off("g", "m", "rate_limited", now=now).until
    m.update_from_headers("g", "m", {}, status=200, now=now)
    assert m.back_off("g", "m", "rate_limited", now=now).until - now == RATE_LADDER_S[2]


@given(
    limit=st.integers(1, 200),
    used=st.integers(0, 250),
    headroom=st.floats(0.0, 0.9),
)
def test_work_that_can_wait_leaves_the_headroom_to_interactive_work(limit, used, headroom):
    """Counted here: a batch item (headroom h) sees the quota used up where the share h of it
    (rounded up to whole requests) is left, an interactive job at the limit; whatever a batch
    may still use, interactive work may too."""
    m = manager(RateLimitedFree(rpd=limit))
    for _ in range(used):
        m.count_usage("g", "m", now=NOW)
    batch = m.classify("g", "m", NOW, headroom)
    interactive = m.classify("g", "m", NOW)
    kept = math.ceil(limit * headroom - 1e-9)
    assert batch.free == (used < limit - kept)
    assert limit * headroom - 1e-9 <= kept < limit * headroom + 1  # the share, rounded up
    assert interactive.free == (used < limit)
    assert not batch.free or interactive.free
    if not batch.free:
        assert batch.free_again_at == window_end("day", NOW)


@given(limit=st.integers(1, 10_000), remaining=st.integers(0, 10_000), headroom=st.floats(0, 0.9))
def test_a_reported_quota_within_the_headroom_is_kept_for_interactive_work(
    limit, remaining, headroom
):
    """Reported by the provider: a batch item stops where `remaining` falls to limit x h, until
    that window resets (then the window holds its limit again); interactive work goes on to 0."""
    remaining = min(remaining, limit)
    m = manager(RateLimitedFree())
    m.update_from_headers(
        "g",
        "m",
        {
            "x-ratelimit-limit-requests": str(limit),
            "x-ratelimit-remaining-requests": str(remaining),
            "x-ratelimit-reset-requests": "30s",
        },
        status=200,
        now=NOW,
    )
    batch = m.classify("g", "m", NOW, headroom)
    assert batch.free == (remaining > math.ceil(limit * headroom - 1e-9))
    assert m.classify("g", "m", NOW).free == (remaining > 0)
    if not batch.free:
        assert batch.free_again_at == NOW + 30
        kept = math.ceil(limit * headroom - 1e-9)
        assert m.classify("g", "m", NOW + 30, headroom).free == (limit > kept)  # the window reset


def test_credits_within_the_headroom_are_kept_for_interactive_work():
    m = manager(CreditBased(budget_usd=10.0, reset="daily"))
    m.set_balance("g", 1.5, now=NOW)
    assert not m.classify("g", "m", NOW, 0.2).free
    assert m.classify("g", "m", NOW, 0.1).free
    assert m.classify("g", "m", NOW).free


def test_the_day_left_to_work_that_keeps_headroom():
    """A configured rpd: its limit less the share kept, less our count; a day window the
    provider reports (Cerebras-style headers) replaces the count; no daily limit: None."""
    m = manager(RateLimitedFree(rpd=10))
    assert m.day_left("g", "m", NOW) == 10 and m.day_left("g", "m", NOW, 0.2) == 8
    for _ in range(9):
        m.count_usage("g", "m", now=NOW)
    assert m.day_left("g", "m", NOW) == 1 and m.day_left("g", "m", NOW, 0.2) == 0
    m.update_from_headers(
        "g",
        "m",
        {
            "x-ratelimit-limit-requests-day": "100",
            "x-ratelimit-remaining-requests-day": "50",
            "x-ratelimit-reset-requests-day": "3600",
        },
        status=200,
        now=NOW,
    )
    assert m.day_left("g", "m", NOW, 0.2) == 50 - 20
    assert m.day_left("g", "m", NOW + 3601, 0.2) == 0  # the report is old: the count again
    assert manager(RateLimitedFree(rpm=5)).day_left("g", "m", NOW) is None


def _minute_headers(limit: int, remaining: int, t: float) -> dict[str, str]:
    """A provider's headers for a minute window (starting at NOW + whole minutes) at NOW + t."""
    reset = (t // 60 + 1) * 60 - t
    return {
        "x-ratelimit-limit-requests": str(limit),
        "x-ratelimit-remaining-requests": str(remaining),
        "x-ratelimit-reset-requests": f"{reset:g}s",
    }


_ANSWERS = ["answer", "fresh answer", "bare answer", "lost"]


@settings(max_examples=examples(300))
@given(
    limit=st.integers(1, 10),
    headroom=st.sampled_from([0.1, 0.2, 0.5]),
    steps=st.lists(
        st.one_of(
            st.tuples(st.sampled_from(["batch", "interactive"]), st.just(0)),
            st.tuples(st.sampled_from(_ANSWERS), st.integers(0, 3)),  # which request's answer
            st.tuples(st.just("wait"), st.sampled_from([1, 2, 60, 119, 120])),  # half seconds
        ),
        max_size=60,
    ),
)
# the answers of two requests sent at once arrive in the other order (each with its own count)
@example(limit=4, headroom=0.2, steps=[("interactive", 0), ("interactive", 0), ("answer", 1),
         ("answer", 0), ("batch", 0), ("batch", 0)])  # fmt: skip
# a request still in flight when an answer to an earlier one reports, a second later
@example(limit=4, headroom=0.2, steps=[("interactive", 0), ("answer", 0), ("batch", 0),
         ("batch", 0), ("wait", 2), ("answer", 0), ("batch", 0)])  # fmt: skip
# the reported window reset: nothing reported of the new one yet
@example(limit=4, headroom=0.2, steps=[("interactive", 0), ("answer", 0), ("wait", 120),
         *[("batch", 0)] * 4])  # fmt: skip
def test_sends_no_report_covers_yet_count_against_the_reported_window(limit, headroom, steps):
    """Any interleaving of sends (batch ones at headroom h, interactive ones), answers with or
    without headers — each with the provider's count when it took the request, or when it
    answered — in any order, answers lost, and time: every batch send starts while the reported
    minute holds fewer than limit - kept(limit, h) requests, whether the report is fresh, stale
    or from a minute that has ended."""
    m = manager(RateLimitedFree())  # no configured limit: only what the headers report
    rule = limit - math.ceil(limit * headroom - 1e-9)
    t = 0.0  # seconds after NOW, in half seconds (exact in floats)
    taken: dict[int, int] = {}  # minute → requests the provider took
    pending: dict[int, tuple[int, int, int]] = {}  # number → (minute, remaining then, status)
    reported = False  # before its first report, the manager knows nothing of the window
    for what, pick in steps:
        minute = int(t // 60)
        if what == "wait":
            t += pick / 2
        elif what in ("batch", "interactive"):
            if what == "batch" and not m.classify("g", "m", NOW + t, headroom).free:
                continue
            number = m.sending("g", "m", now=NOW + t)
            status = 200 if taken.get(minute, 0) < limit else 429
            taken[minute] = taken.get(minute, 0) + (status == 200)
            if what == "batch" and reported:
                assert taken[minute] <= rule
            pending[number] = (minute, limit - taken[minute], status)
        elif pending:
            number = sorted(pending)[pick % len(pending)]
            sent_in, remaining_then, status = pending.pop(number)
            if what == "lost":
                continue
            # the count when it took the request (the same minute), or when it answers
            then = what == "answer" and sent_in == minute
            remaining = remaining_then if then else limit - taken.get(minute, 0)
            headers = {} if what == "bare answer" else _minute_headers(limit, remaining, t)
            reported = reported or bool(headers)
            if status == 429:
                m.back_off("g", "m", "rate_limited", headers=headers, status=429, now=NOW + t,
                           sent=number)  # fmt: skip
            else:
                m.update_from_headers("g", "m", headers, status=200, now=NOW + t, sent=number)


def test_an_answer_of_a_window_already_over_does_not_replace_the_running_one():
    """A minute's answer that arrives after the next minute's (its reset 57.5 s sooner) does not
    bring back that minute's figure: the running window's stays."""
    m = manager(RateLimitedFree())
    m.update_from_headers("g", "m", _minute_headers(8, 2, 61.0), status=200, now=NOW + 61)
    late = {**_minute_headers(8, 7, 59.5), "x-ratelimit-reset-requests": "0.5s"}
    m.update_from_headers("g", "m", late, status=200, now=NOW + 62)
    verdict = m.classify("g", "m", NOW + 62, 0.2)
    assert not verdict.free and verdict.free_again_at == NOW + 120


def test_tokens_a_request_in_flight_may_use_count_against_a_reported_token_window():
    """A token window reported (500 of 1,000 left): a request sent since that may use 300 leaves
    200, the share 0.2 keeps; its answer's report replaces the estimate."""
    m = manager(RateLimitedFree())
    tokens = {
        "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": "500",
        "x-ratelimit-reset-tokens": "30s",
    }
    m.update_from_headers("g", "m", tokens, status=200, now=NOW)
    assert m.reports_tokens("g", "m") and m.classify("g", "m", NOW, 0.2).free
    sent = m.sending("g", "m", now=NOW, expected_tokens=300)
    assert not m.classify("g", "m", NOW, 0.2).free
    assert m.classify("g", "m", NOW).free  # interactive work: unchanged
    answer = {**tokens, "x-ratelimit-remaining-tokens": "350"}  # it used 150
    m.update_from_headers("g", "m", answer, status=200, now=NOW + 1, sent=sent)
    assert m.classify("g", "m", NOW + 1, 0.2).free

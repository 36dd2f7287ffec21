"""The forecast (issue 31): each free quota's projected end and the paid day's at the last hour's
rate — the arithmetic (pure, Hypothesis), the rate read from the audit, `GET /v1/forecast` through a
real sidecar on a virtual clock, who sees whose spend, the door it shares with the other views, and
`lanes status`'s lines."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx2
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from helpers import http_client, lanes_command
from lanes._core.audit.forecast import (
    PaidDay,
    Quota,
    exhausted_at,
    forecast_body,
    project_paid,
    project_quota,
    recent_use,
    scope_rates,
    spend_at,
    urgency,
)
from lanes._core.state.store import SQLiteStore
from lanes._http.app import ROUTES
from lanes.testing import answer
from sidecar import open_sidecar

T0 = datetime(2026, 3, 2, 6, 0, tzinfo=UTC).timestamp()  # a Monday, 06:00 UTC
MIDNIGHT = datetime(2026, 3, 3, tzinfo=UTC).timestamp()
HI = [{"role": "user", "content": "hi"}]

times = st.floats(0, 4e9, allow_nan=False)
counts = st.floats(0, 1e9, allow_nan=False)
rates = st.one_of(st.none(), st.floats(0, 1e9, allow_nan=False))
positive = st.floats(1e-6, 1e9, allow_nan=False)


def quota(**kw: Any) -> Quota:
    fields: dict[str, Any] = {
        "scope": "free/m",
        "lane": "free",
        "dimension": "requests",
        "window": "day",
        "used": 40.0,
        "limit": 100.0,
        "resets_at": MIDNIGHT,
        "source": "counted",
        **kw,
    }
    return Quota(**fields)


# -- the arithmetic --------------------------------------------------------------------------------


@given(used=counts, limit=counts, rate=rates, now=times)
def test_the_projected_end_is_never_before_now_and_needs_a_rate(used, limit, rate, now):
    """However much is used and at whatever rate, the projected end is at or after now; with no
    rate (none, or nothing used in the window) there is no time at all."""
    at = exhausted_at(used=used, limit=limit, rate_per_hour=rate, now=now)
    if rate is None or rate == 0:
        assert at is None
    else:
        assert at is not None and at >= now


@given(used=counts, limit=counts, slow=positive, fast=positive, now=times)
def test_a_faster_rate_never_lasts_longer(used, limit, slow, fast, now):
    """The projected end is monotone in the rate: a higher rate ends no later."""
    slow, fast = sorted((slow, fast))
    late = exhausted_at(used=used, limit=limit, rate_per_hour=slow, now=now)
    early = exhausted_at(used=used, limit=limit, rate_per_hour=fast, now=now)
    assert early is not None and late is not None and early <= late


@given(spent=counts, rate=rates, slower=rates, now=times, left=st.floats(-1e6, 1e6))
def test_the_spend_projection_is_never_below_what_is_spent(spent, rate, slower, now, left):
    """At any rate and whatever time is left of the day (none, or past), the projected spend is
    at least today's, and no lower at a higher rate."""
    at = spend_at(spent=spent, rate_per_hour=rate, now=now, end=now + left)
    assert at >= spent
    low, high = sorted((rate or 0.0, slower or 0.0))
    assert spend_at(spent=spent, rate_per_hour=low, now=now, end=now + left) <= spend_at(
        spent=spent, rate_per_hour=high, now=now, end=now + left
    )


@given(used=counts, limit=positive, rate=rates, now=st.floats(0, 2e9), reset_in=positive)
def test_a_quota_outlook_says_how_and_never_states_a_time_past_the_reset(
    used, limit, rate, now, reset_in
):
    """Every outlook is said as a projection or a count: a time only when it runs out before the
    reset (and then after now); "no use in the last hour" without a rate; "not … before its
    reset" when it would last past it."""
    f = project_quota(quota(used=used, limit=limit, resets_at=now + reset_in), rate, now)
    if f.projected_exhausted_at is not None:
        assert f.outlook == "runs_out"
        assert now <= f.projected_exhausted_at < now + reset_in
    if f.outlook in ("runs_out", "lasts"):
        assert f.note.startswith("projected") and "at the last 60 min's rate: " in f.note
    if f.outlook == "no_rate":
        assert rate in (None, 0.0) and "no use in the last hour" in f.note
    if f.outlook == "lasts":
        assert "not to run out before its reset" in f.note
    assert (f.outlook == "used_up") == (used >= limit)


@given(spent=counts, ceiling=positive, rate=rates, now=st.floats(0, 2e9), left=positive)
def test_the_paid_outlook_never_falls_below_the_spend(spent, ceiling, rate, now, left):
    """The paid day's projection is at least its spend; a time the ceiling is reached is only
    given before the day ends, and the note says "projected" whenever there is a rate."""
    f = project_paid(PaidDay(spent_usd=spent, ceiling_usd=ceiling, ends_at=now + left), rate, now)
    assert f.projected_usd >= spent
    if f.projected_ceiling_at is not None:
        assert f.outlook == "reaches_ceiling" and now <= f.projected_ceiling_at < now + left
    if f.outlook in ("within", "reaches_ceiling"):
        assert "projected" in f.note and "at the last 60 min's rate: $" in f.note
    if f.outlook == "no_rate":
        assert "no paid spend in the last hour" in f.note


def test_the_notes_of_a_worked_example():
    """40 of 100 requests at 20/h from 06:00 UTC run out at 09:00; at 2/h they last past
    midnight; $0.30 of a $1.00 ceiling at $0.10/h reaches it at 13:00."""
    runs_out = project_quota(quota(), 20.0, T0)
    assert runs_out.projected_exhausted_at == T0 + 3 * 3600
    assert runs_out.note == (
        "projected to run out at 2026-03-02 09:00 UTC, at the last 60 min's rate: "
        "20 requests/h; it resets at 2026-03-03 00:00 UTC"
    )
    lasts = project_quota(quota(), 2.0, T0)
    assert lasts.outlook == "lasts" and lasts.projected_exhausted_at is None
    assert lasts.note == (
        "projected not to run out before its reset at 2026-03-03 00:00 UTC, at the last 60 "
        "min's rate: 2 requests/h"
    )
    idle = project_quota(quota(), None, T0)
    assert idle.note == "no use in the last hour: no projection; it resets at 2026-03-03 00:00 UTC"
    paid = project_paid(PaidDay(spent_usd=0.3, ceiling_usd=1.0, ends_at=MIDNIGHT), 0.1, T0)
    assert paid.outlook == "reaches_ceiling"
    assert paid.projected_ceiling_at == pytest.approx(T0 + 7 * 3600)
    assert paid.projected_usd == pytest.approx(0.3 + 1.8)
    assert "reach the ceiling $1.00 at 2026-03-02 13:00 UTC" in paid.note


@given(st.lists(st.tuples(counts, positive, rates), max_size=30), st.integers(1, 10))
def test_the_forecast_is_bounded_and_most_urgent_first(figures, most):
    """At most `most` quotas are listed, the used-up and the soonest to run out first; the
    others are counted in `left_off`."""
    quotas = [
        quota(scope=f"lane{i}/m", used=used, limit=limit)
        for i, (used, limit, _) in enumerate(figures)
    ]
    rates_ = {(q.scope, "requests"): r for q, (_, _, r) in zip(quotas, figures, strict=True)}
    day = PaidDay(spent_usd=0.0, ceiling_usd=1.0, ends_at=MIDNIGHT)
    body = forecast_body(quotas, rates_, day, paid_rate=None, now=T0, most=most)
    assert len(body["quotas"]) == min(most, len(quotas))
    assert body["left_off"] == len(quotas) - len(body["quotas"])
    every = sorted(
        (project_quota(q, rates_[(q.scope, "requests")], T0) for q in quotas), key=urgency
    )
    assert [q["scope"] for q in body["quotas"]] == [f.quota.scope for f in every[:most]]
    assert body["method"]["window_s"] == 3600 and json.dumps(body)  # JSON, whatever the figures


def test_the_rate_is_the_last_hours_attempts_in_the_audit():
    """Free attempts of the jobs that ended in the last hour count per (lane, model), every
    client's; paid spend counts every client's or one's; older attempts and other tiers not."""
    store = SQLiteStore(":memory:")

    def job(i: int, at: float, client: str, attempts: list[tuple[str, str, str, int, float]]):
        rows = [
            {"job": f"j{i}", "n": n, "at": at, "client": client, "lane": lane, "model": model}
            | {"tier": tier, "tokens": tokens, "cost_usd": cost}
            for n, (lane, model, tier, tokens, cost) in enumerate(attempts)
        ]
        return {"job": f"j{i}", "at": at, "client": client, "attempt_rows": rows}

    store.records.add_audit(
        [
            job(0, T0 - 4000, "ci", [("free", "a", "free", 10, 0.0)]),  # before the window
            job(1, T0 - 100, "ci", [("free", "a", "free", 10, 0.0), ("paid", "p", "paid", 5, 0.2)]),
            job(2, T0 - 50, "web", [("free", "b", "free", 7, 0.0), ("paid", "p", "paid", 5, 0.1)]),
            job(3, T0 - 10, "web", [("own", "l", "local", 99, 0.0)]),
        ]
    )
    every = recent_use(store.records.query, since=T0 - 3600)
    ci = recent_use(store.records.query, since=T0 - 3600, client="ci")
    assert dict(every.by_model) == {("free", "a"): (1, 10), ("free", "b"): (1, 7)}
    assert ci.by_model == every.by_model  # a free quota is every client's
    assert every.paid_usd == pytest.approx(0.3) and ci.paid_usd == pytest.approx(0.2)
    shared = scope_rates(every, lambda lane, model: f"{lane}/*")
    assert shared == {("free/*", "requests"): 2.0, ("free/*", "tokens"): 17.0}


# -- through a sidecar -----------------------------------------------------------------------------

DAY_HEADERS = {  # a provider that reports its daily requests (Cerebras-style suffixes)
    "x-ratelimit-limit-requests-day": "1000",
    "x-ratelimit-remaining-requests-day": "700",
    "x-ratelimit-reset-requests-day": "3600",
}
#: Under the autojump clock, trio's time jumps only once everything has waited this long in real
#: time: the forecast reads the audit in a worker thread, and a jump at once would move virtual
#: time on (and time the client out) while the thread runs. `skipping` jumps at once again.
STEADY_S = 0.25


@contextlib.contextmanager
def skipping(clock: Any) -> Iterator[None]:
    """Within: the clock jumps as soon as all is idle (a virtual hour passes in moments)."""
    clock.autojump_threshold = 0
    try:
        yield
    finally:
        clock.autojump_threshold = STEADY_S


LANES: tuple[Any, ...] = (
    (
        "free",
        "free",
        ["free-model"],
        {"free_tier": {"kind": "rate_limited", "rpd": 10, "tpd": 10**6}},
    ),
    ("spare", "free", ["spare-model"], {"free_tier": {"kind": "rate_limited", "rpd": 50}}),
    ("told", "free", ["big-model"]),
    ("paid", "paid", ["paid-model"]),
)
POLICY = {"free_tier_fallback": "allow", "paid_ceiling_usd_per_day": 1.0}


async def jobs(http: httpx2.AsyncClient, url: str, model: str, n: int, **headers: str) -> None:
    for _ in range(n):
        reply = await http.post(
            f"{url}/chat/completions", json={"model": model, "messages": HI}, headers=headers
        )
        assert reply.status_code == 200, reply.text


def by_scope(body: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(q["scope"], q["dimension"]): q for q in body["quotas"]}


@pytest.mark.free_lane
async def test_the_forecast_of_a_morning_through_the_sidecar(autojump_clock):
    """At 06:00 UTC, 4 of 10 requests a day used in the last hour run out at 07:30 (projected);
    the tokens last past midnight; an unused lane has no rate and no time; a provider's own daily
    figure is read as reported; paid spend is projected to midnight. An hour later, with no use
    since, nothing is projected any more."""
    autojump_clock.autojump_threshold = STEADY_S
    async with (
        open_sidecar(*LANES, policy=POLICY, epoch_now=T0) as (url, fakes),
        http_client() as http,
    ):
        fakes["told"].script("big-model", answer(headers=DAY_HEADERS))
        await jobs(http, url, "free/free-model", 4)
        await jobs(http, url, "told/big-model", 1)
        await jobs(http, url, "paid/paid-model", 1)
        await trio.sleep(2)  # the state sync writes the audit
        morning = (await http.get(f"{url}/forecast")).json()
        spent = (await http.get(f"{url}/lanes")).json()["paid"]["spent_today_usd"]
        with skipping(autojump_clock):
            await trio.sleep(3600)
        later = (await http.get(f"{url}/forecast")).json()
    at, quotas = morning["at"], by_scope(morning)
    assert morning["method"]["window_s"] == 3600 and morning["method"]["since"] == at - 3600
    requests = quotas[("free/free-model", "requests")]
    assert requests | {"note": ""} == requests | {
        "used": 4,
        "limit": 10,
        "window": "day",
        "source": "counted",
        "resets_at": MIDNIGHT,
        "rate_per_hour": 4.0,
        "outlook": "runs_out",
        "note": "",
    }
    assert requests["projected_exhausted_at"] == pytest.approx(at + 1.5 * 3600)
    assert requests["note"].startswith("projected to run out at 2026-03-02 07:30 UTC, at the last")
    assert "at the last 60 min's rate: 4 requests/h" in requests["note"]
    tokens = quotas[("free/free-model", "tokens")]
    assert tokens["outlook"] == "lasts" and tokens["projected_exhausted_at"] is None
    assert tokens["used"] == tokens["rate_per_hour"] > 0  # the counts and the audit agree
    spare = quotas[("spare/spare-model", "requests")]
    assert (spare["used"], spare["rate_per_hour"], spare["projected_exhausted_at"]) == (
        0,
        None,
        None,
    )
    assert spare["outlook"] == "no_rate" and "no use in the last hour" in spare["note"]
    told = quotas[("told/big-model", "requests")]
    assert (told["source"], told["used"], told["limit"], told["outlook"]) == (
        "reported",
        300,
        1000,
        "lasts",
    )
    assert morning["quotas"][0]["scope"] == "free/free-model"  # the one running out, first
    assert morning["left_off"] == 0
    paid = morning["paid"]
    assert paid["client"] is None and paid["spent_usd"] == spent > 0
    assert paid["rate_per_hour_usd"] == pytest.approx(spent)
    assert paid["day_ends_at"] == MIDNIGHT and paid["outlook"] == "within"
    assert paid["projected_usd"] == pytest.approx(spent * (1 + (MIDNIGHT - at) / 3600))
    assert (
        paid["note"].startswith("projected $")
        and "of $1.00 at 2026-03-03 00:00 UTC" in paid["note"]
    )
    # an hour on: the day's counts stand, the rate is gone, so is every projected time
    hour_later = by_scope(later)
    idle = hour_later[("free/free-model", "requests")]
    assert (idle["used"], idle["rate_per_hour"], idle["projected_exhausted_at"]) == (4, None, None)
    assert idle["outlook"] == "no_rate" and "no use in the last hour" in idle["note"]
    assert ("told/big-model", "requests") not in hour_later  # its reported window has reset
    assert later["paid"]["outlook"] == "no_rate" and later["paid"]["projected_usd"] == spent
    assert "no paid spend in the last hour" in later["paid"]["note"]


ADMIN, CI, WEB = "admin-key-0123456789abcdef", "ci-key-0123456789abcdef", "web-key-0123456789abc"
ENV = {"ADMIN_KEY": ADMIN, "CI_KEY": CI, "WEB_KEY": WEB}
SERVER = {
    "clients": {"ci": "CI_KEY", "web": {"key_env": "WEB_KEY", "paid_ceiling_usd_per_day": 0.5}},
    "admin_key_env": "ADMIN_KEY",
}


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


async def test_a_client_sees_its_own_paid_day_and_the_admin_all(autojump_clock):
    """`web` spends on the paid lane: with its key it sees its spend against its own $0.50
    ceiling; `ci` sees none of it ($0, no rate); the admin key sees every client's."""
    autojump_clock.autojump_threshold = STEADY_S
    paid = ("paid", "paid", ["paid-model"])
    async with (  # at T0 (06:00 UTC): the spend and the look at it fall on one UTC day
        open_sidecar(paid, policy=POLICY, server=SERVER, env=ENV, epoch_now=T0) as (url, _),
        http_client() as http,
    ):
        await jobs(http, url, "paid/paid-model", 2, **auth(WEB))
        await trio.sleep(2)
        seen = {
            who: (await http.get(f"{url}/forecast", headers=auth(key))).json()["paid"]
            for who, key in (("ci", CI), ("web", WEB), ("admin", ADMIN))
        }
    assert seen["web"]["client"] == "web" and seen["web"]["ceiling_usd"] == 0.5
    assert seen["web"]["spent_usd"] > 0 and seen["web"]["rate_per_hour_usd"] is not None
    assert seen["ci"] | {"note": "", "day_ends_at": 0} == {
        "client": "ci",
        "this_host": False,
        "spent_usd": 0,
        "ceiling_usd": 1.0,
        "day_ends_at": 0,
        "rate_per_hour_usd": None,
        "outlook": "no_rate",
        "projected_usd": 0,
        "projected_ceiling_at": None,
        "note": "",
    }
    assert seen["admin"]["client"] is None
    assert seen["admin"]["spent_usd"] == pytest.approx(seen["web"]["spent_usd"])


async def test_the_forecast_is_behind_the_same_door_as_the_other_views(autojump_clock):
    """`/v1/forecast` is a CALLER route, as `/v1/lanes` and `/v1/report` are, and answers what
    they answer: 401 without a key or with an unknown one, 421 under a name that is not
    loopback's (DNS rebinding), 405 to a POST, 200 with a client key whatever the site says."""
    autojump_clock.autojump_threshold = STEADY_S
    (row,) = [r for r in ROUTES if r.path == "/v1/forecast"]
    assert (
        row.methods == ("GET",)
        and row.door is next(r for r in ROUTES if r.path == "/v1/lanes").door
    )
    cases = {
        "no key": {},
        "unknown key": auth("not-a-key-0123456789"),
        "rebinding": {**auth(CI), "host": "evil.example"},
        "cross-site": {**auth(CI), "sec-fetch-site": "cross-site", "origin": "http://evil.example"},
    }
    async with (
        open_sidecar(("paid", "paid", ["paid-model"]), policy=POLICY, server=SERVER, env=ENV) as (
            url,
            _,
        ),
        http_client() as http,
    ):
        answers = {
            (name, path): (await http.get(f"{url}/{path}", headers=headers)).status_code
            for name, headers in cases.items()
            for path in ("forecast", "lanes", "report")
        }
        posted = {
            p: (await http.post(f"{url}/{p}", json={})).status_code for p in ("forecast", "report")
        }
        body = (await http.get(f"{url}/forecast")).text
    for name in cases:
        assert answers[(name, "forecast")] == answers[(name, "lanes")] == answers[(name, "report")]
    assert [answers[(name, "forecast")] for name in cases] == [401, 401, 421, 200]
    assert posted == {"forecast": 405, "report": 405}
    assert "invalid_api_key" in body and CI not in body


# -- lanes status ----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.free_lane
async def test_lanes_status_prints_a_line_for_each_quota_and_the_paid_day():
    """`lanes status` ends with the forecast: the paid day's line and one per quota, each saying
    "projected" or that there is no use to project from; `--json` carries the forecast too."""
    async with open_sidecar(*LANES, policy=POLICY) as (url, _fakes), http_client() as http:
        await jobs(http, url, "free/free-model", 2)
        with trio.fail_after(20):  # the state sync writes the audit within a second
            while True:
                forecast = (await http.get(f"{url}/forecast")).json()
                if forecast["quotas"][0]["rate_per_hour"] is not None:
                    break
                await trio.sleep(0.1)
        base = url.removesuffix("/v1")

        text = await trio.to_thread.run_sync(lanes_command, "status", "--url", base)
        data = await trio.to_thread.run_sync(lanes_command, "status", "--url", base, "--json")
    assert text.returncode == 0, text.stderr
    lines = [line for line in text.stdout.splitlines() if line.startswith("forecast: ")]
    assert lines[0].startswith("forecast: paid today $0.00; no paid spend in the last hour")
    quota_lines = {line.split(" ")[1] + " " + line.split(" ")[2]: line for line in lines[1:]}
    assert set(quota_lines) == {
        "free/free-model requests/day",
        "free/free-model tokens/day",
        "spare/spare-model requests/day",
    }
    free = quota_lines["free/free-model requests/day"]
    assert " 2/10; projected " in free and "at the last 60 min's rate: 2 requests/h" in free
    assert "no use in the last hour" in quota_lines["spare/spare-model requests/day"]
    assert json.loads(data.stdout)["forecast"]["method"]["window_s"] == 3600


def test_a_day_the_others_closed_shows_closed_to_a_client() -> None:
    """A client under its own ceiling, on a day the other clients' spend took the global one:
    its paid day says the ceiling is reached (not how much the others spent)."""
    open_day = PaidDay(spent_usd=0.01, ceiling_usd=1.0, ends_at=86400.0, client="ci")
    closed_day = PaidDay(spent_usd=0.01, ceiling_usd=1.0, ends_at=86400.0, client="ci", closed=True)
    assert project_paid(open_day, None, now=3600.0).outlook == "no_rate"
    shut = project_paid(closed_day, 0.5, now=3600.0)
    assert shut.outlook == "at_ceiling" and shut.projected_ceiling_at is None
    assert "global ceiling is reached" in shut.note


def test_under_a_shared_store_a_client_without_a_ceiling_sees_its_own_audited_spend() -> None:
    """Redis keeps no total for a client without a ceiling of its own: its paid day is what this
    host's audit settled for it — never every client's spend (which, less its own, would be the
    other tenants'), never a zero made up."""
    from lanes._core.audit.quotas import paid_day

    class Ledger:
        def ceiling(self, client: str | None = None) -> float:
            return 10.0

        def client_ceiling(self, client: str) -> float | None:
            return None

        def spent_today(self, client: str | None = None) -> float:
            return 9.0 if client is None else 0.0  # the store's total; no client total kept

        def left_today(self, client: str | None = None) -> float:
            return 1.0

        def day_ends_at(self) -> float:
            return 86400.0

    ledger = Ledger()
    asked: list[tuple[str, float]] = []

    def audited(client: str, since: float) -> float:
        asked.append((client, since))
        return 0.5

    day = paid_day(ledger, True, "alice", audited=audited)
    assert (day.client, day.spent_usd, day.this_host, day.closed) == ("alice", 0.5, True, False)
    assert asked == [("alice", 0.0)]  # since the ledger's day began
    every = paid_day(ledger, True)
    assert every.spent_usd == 9.0 and every.client is None  # the admin's


@given(
    total=st.integers(0, 100_000),
    completed=st.integers(0, 100_000),
    failed=st.integers(0, 100_000),
    started_ago=st.floats(0, 7 * 86400),
    window=st.floats(3600, 7 * 86400),
    waits=st.floats(0, 86400),
)
def test_a_batch_outlook_never_ends_before_now_nor_past_its_window(
    total, completed, failed, started_ago, window, waits
):
    """A batch's projected end is never before now (nor before its items' next try), only ever
    within its window (past it, the outlook is `expires` and no time is given), and its items
    left are what its counts leave; a batch never pays."""
    from lanes._core.batch.outlook import batch_outlook

    now = 1_800_000_000.0
    completed, failed = min(completed, total), min(failed, total - min(completed, total))
    batch = {
        "id": "batch_x",
        "status": "in_progress",
        "request_counts": {"total": total, "completed": completed, "failed": failed},
        "in_progress_at": now - started_ago,
        "expires_at": now - started_ago + window,
        "next_try_at": now + waits if waits else None,
    }
    got = batch_outlook(batch, now)
    assert got["left"] == total - completed - failed and got["paid_usd"] == 0.0
    if got["outlook"] == "finishes":
        assert now + waits <= got["projected_end_at"] <= batch["expires_at"]
    else:
        assert got["projected_end_at"] is None
    if completed + failed == 0 and got["left"]:
        assert got["outlook"] == "no_rate"
    assert got["note"]

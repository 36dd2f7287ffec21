"""The status page in a real headless Chromium: a pending approval appears, a click approves it, and
the held request completes; the console switches lanes and revokes grants, and works with client
keys configured; the report is drawn as SVG charts; nothing is fetched from another origin, the
page's CSP is never violated, and a page of another origin that frames it switches nothing."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio
from test_forecast import DAY_HEADERS
from test_forecast import LANES as FORECAST_LANES
from test_forecast import POLICY as FORECAST_POLICY
from test_forecast import jobs as forecast_jobs

from helpers import http_client
from lanes.harness.processes import free_port
from lanes.testing import answer, rate_limited
from sidecar import CLIENT_KEY, open_sidecar

pytestmark = pytest.mark.slow  # every test here drives Chromium

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


#: How long the page may take to show what a test waits for — a hang detector, not a speed
#: claim: well under a second on an idle machine, but Chromium is the heaviest process here and
#: a loaded one (two suites at once) starved it past the 10 s these waits used to allow.
SHOWN_MS = 60_000
LOCAL_AND_PAID = (("local", "local", ["local-model"]), ("paid", "paid", ["paid-model"]))
ADMIN_KEY = "lanes-admin-key-page-0123456789"
KEYED = {"clients": {"alice": "CLIENT_KEY"}, "admin_key_env": "ADMIN_KEY"}
PROMPTS = ("zebra-prompt-once", "zebra-prompt-hour")


async def needs_a_browser() -> None:
    if not await trio.Path(CHROMIUM).exists():
        pytest.skip(
            "Debian's chromium is not installed and could not be (make browser needs root and apt)"
        )
    pytest.importorskip(
        "playwright.sync_api", reason="playwright is a test dependency; reinstall with make install"
    )


def watch(page, seen: dict[str, Any]) -> None:
    """Record every request the page makes and every console message (a CSP violation is one)."""
    seen.setdefault("requests", [])
    seen.setdefault("console", [])
    page.on(
        "request",
        lambda r: seen["requests"].append(
            {"method": r.method, "url": r.url, "headers": r.headers, "body": r.post_data}
        ),
    )
    page.on("console", lambda m: seen["console"].append(m.text))


class Chromium:
    """One Chromium for the module, driven from one thread of its own: Playwright's sync objects
    belong to the thread that made them. Launching it (and Playwright's driver) for every test
    cost two seconds of CPU each; each page now gets a fresh context instead — its own cookies,
    storage and cache, as a new browser's would be."""

    def __init__(self) -> None:
        self.thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="chromium")
        self._playwright: Any = None
        self._browser: Any = None

    def browser(self) -> Any:
        """The browser, launched on first use (in the Chromium thread)."""
        if self._browser is None:
            from playwright.sync_api import sync_playwright

            self._playwright = sync_playwright().start()
            self._browser = self._playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        return self._browser

    async def run(self, fn: Any, *args: Any) -> Any:
        """`fn(*args)` in the Chromium thread, awaited from trio."""
        return await trio.to_thread.run_sync(lambda: self.thread.submit(fn, *args).result())

    def close(self) -> None:
        def stop() -> None:
            if self._browser is not None:
                self._browser.close()
                self._playwright.stop()

        self.thread.submit(stop).result()
        self.thread.shutdown()


CHROME = Chromium()


@pytest.fixture(scope="module", autouse=True)
def chromium() -> Iterator[Chromium]:
    """The module's Chromium, closed after its last test (module-scoped: pytest-xdist runs the
    module's tests on one worker, tests/conftest.py)."""
    try:
        yield CHROME
    finally:
        CHROME.close()


@contextlib.contextmanager
def open_page(base: str, seen: dict[str, Any]) -> Iterator[Any]:
    """A fresh page (in a context of its own) at `base`; every request and console message
    recorded in `seen`. In the Chromium thread (`CHROME.run`)."""
    context = CHROME.browser().new_context()
    try:
        page = context.new_page()
        watch(page, seen)
        page.goto(base + "/")
        yield page
    finally:
        context.close()


def approve_in_browser(base: str, screenshot: str | None) -> str:
    """Open the page, wait for the pending approval, click "Approve once"; return what it showed."""
    seen: dict[str, Any] = {}
    with open_page(base, seen) as page:
        approval = page.locator("div.approval").first
        approval.wait_for(timeout=SHOWN_MS)
        shown = approval.inner_text()
        approval.get_by_role("button", name="Approve once").click()
        page.locator("#approvals .none").wait_for(timeout=SHOWN_MS)
        page.get_by_text("paid_fallback").first.wait_for(timeout=SHOWN_MS)
        if screenshot:
            page.screenshot(path=screenshot, full_page=True)
        return shown


@pytest.mark.free_lane
async def test_approve_a_held_request_from_the_page():
    """A job held for approval appears on the page; clicking Approve once lets it through."""
    await needs_a_browser()
    policy = {"free_tier_fallback": "ask", "approval_wait_s": 30}
    async with open_sidecar(
        ("free", "free", ["free-model"]), ("paid", "paid", ["paid-model"]), policy=policy
    ) as (url, fakes):
        fakes["free"].script("free-model", rate_limited(retry_after=60))
        base = url[:-3]
        box = {}

        async def held() -> None:
            async with httpx2.AsyncClient(trust_env=False, timeout=40) as http:
                box["response"] = await http.post(
                    f"{url}/chat/completions",
                    json={"messages": [{"role": "user", "content": "hi"}]},
                )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(held)
            shown = await CHROME.run(
                approve_in_browser, base, os.environ.get("LANES_PAGE_SCREENSHOT")
            )
    response = box["response"]
    assert "paid/paid-model" in shown and "free/free-model" in shown
    assert response.status_code == 200 and response.headers["x-lanes-route"] == "paid_fallback"
    assert len(fakes["paid"].requests()) == 1


def drive_the_console(base: str, screenshot: str | None) -> dict[str, Any]:
    """Enter an admin key, switch a lane off and on from its row, read the recent jobs and the
    canary column; return what was seen and every request the page made."""
    seen: dict[str, Any] = {}
    with open_page(base, seen) as page:
        page.fill("#admin-key", "k-admin-page")
        page.click("#admin-save")
        switch = page.locator("button.switch[data-lane=local]")
        switch.wait_for(timeout=SHOWN_MS)
        assert switch.inner_text() == "Switch off"
        switch.click()
        page.locator("button.switch[data-lane=local]", has_text="Switch on").wait_for(
            timeout=SHOWN_MS
        )
        seen["row_off"] = page.locator("tr[data-lane=local]").first.inner_text()
        page.locator("button.switch[data-lane=local]").click()
        page.locator("button.switch[data-lane=local]", has_text="Switch off").wait_for(
            timeout=SHOWN_MS
        )
        page.locator(".quarantined").first.wait_for(timeout=SHOWN_MS)
        seen["quarantined_row"] = page.locator("tr[data-lane=paid]").first.inner_text()
        page.locator("#recent tr").first.wait_for(timeout=SHOWN_MS)
        seen["recent"] = page.locator("#recent tr").first.inner_text()
        seen["stored_key"] = page.evaluate("sessionStorage.getItem('lanes-admin-key')")
        seen["url"] = page.url
        if screenshot:
            page.screenshot(path=screenshot, full_page=True)
    return seen


async def test_the_console_switches_lanes_and_shows_jobs(tmp_path):
    """The page's kill-switch toggles send JSON with the admin key as a Bearer token (never in a
    URL), the lane goes off and on; recent jobs show request id, model, client, cohort, latency
    and cost; a quarantined model is marked; the page loads nothing from elsewhere."""
    await needs_a_browser()
    from lanes._core.state.store import SQLiteStore

    state = str(tmp_path / "state.db")
    async with open_sidecar(
        ("local", "local", ["local-model"]), ("paid", "paid", ["paid-model"]), state=state
    ) as (url, fakes):
        base = url[:-3]
        async with httpx2.AsyncClient(trust_env=False, timeout=20) as http:
            job = await http.post(
                f"{url}/chat/completions",
                json={"messages": [{"role": "user", "content": "hi"}]},
                headers={"x-lanes-cohort": "nightly"},
            )
            favicon = await http.get(f"{base}/favicon.ico")
            html = (await http.get(f"{base}/")).text
        store = SQLiteStore(state)
        store.set_quarantine("paid/paid-model", "drifted", "drift 0.9")
        store.close()
        seen = await CHROME.run(drive_the_console, base, os.environ.get("LANES_PAGE_SCREENSHOT"))
        async with httpx2.AsyncClient(trust_env=False) as http:
            lanes_now = (await http.get(f"{url}/lanes")).json()
    posts = [r for r in seen["requests"] if r["method"] == "POST"]
    assert [r["url"].removeprefix(base) for r in posts] == [
        "/v1/lanes/local/off",
        "/v1/lanes/local/on",
    ]
    for r in posts:
        assert r["headers"]["content-type"] == "application/json" and r["body"] == "{}"
        assert r["headers"]["authorization"] == "Bearer k-admin-page"
    assert all("k-admin-page" not in r["url"] for r in seen["requests"])
    assert all(r["url"].startswith(base) for r in seen["requests"])  # no external asset
    assert "http://" not in html and "https://" not in html and favicon.status_code == 204
    assert not [m for m in seen["console"] if "Content Security Policy" in m], seen["console"]
    assert "off" in seen["row_off"] and seen["stored_key"] == "k-admin-page"
    assert "quarantined" in seen["quarantined_row"]
    request_id = job.headers["x-lanes-request-id"]
    for shown in (request_id[:12], "local-model", "anonymous", "nightly", " ms", "$0.000000"):
        assert shown in seen["recent"], seen["recent"]
    assert next(lane for lane in lanes_now["lanes"] if lane["name"] == "local")["off"] is False


def revoke_in_browser(
    base: str, keys: tuple[str, ...], ids: list[str], screenshot: str | None
) -> dict[str, Any]:
    """Open the page; with `keys`, first see the views refused, then try each key in turn (all but
    the last are expected to be refused the revocation). Revoke every grant in `ids` from its row;
    return what was seen."""
    seen: dict[str, Any] = {}
    with open_page(base, seen) as page:
        rows = page.locator("#grants tr.grant")
        if keys:
            page.locator("#grants tr.bad").wait_for(timeout=SHOWN_MS)
            seen["without_key"] = page.inner_text("#grants")
            seen["summary_without_key"] = page.inner_text("#summary")
        for key in keys[:-1]:
            page.fill("#admin-key", key)
            page.click("#admin-save")
            rows.nth(len(ids) - 1).wait_for(timeout=SHOWN_MS)
            rows.first.get_by_role("button", name="Revoke").click()
            page.locator("#notice", has_text="403").wait_for(timeout=SHOWN_MS)
            seen.setdefault("refused", []).append(page.inner_text("#notice"))
            seen.setdefault("rows_after_refusal", []).append(rows.count())
        if keys:
            page.fill("#admin-key", keys[-1])
            page.click("#admin-save")
        rows.nth(len(ids) - 1).wait_for(timeout=SHOWN_MS)
        seen["rows"] = {r.get_attribute("data-id"): r.inner_text() for r in rows.all()}
        if screenshot:
            page.screenshot(path=screenshot.replace(".png", "-grants.png"), full_page=True)
        for grant_id in ids:
            row = page.locator(f"#grants tr.grant[data-id='{grant_id}']")
            row.get_by_role("button", name="Revoke").click()
            row.wait_for(state="detached", timeout=SHOWN_MS)
        page.locator("#grants tr.none").wait_for(timeout=SHOWN_MS)
        seen["notice"] = page.inner_text("#notice")
        seen["html"] = page.content()
    return seen


@pytest.mark.parametrize("keyed", [False, True], ids=["no keys", "client and admin keys"])
async def test_grants_are_listed_and_revoked_from_the_page(keyed):
    """An hour's grant and an unused "approve once" are listed (who, what, until) with a Revoke
    button each; a click revokes it (DELETE as JSON, with the admin key when keys are configured)
    and the row goes; without a key the views say so, a client key's revocation is refused with a
    visible 403; afterwards GET /v1/grants is empty and the client is asked again."""
    await needs_a_browser()
    ask = {"free_tier_fallback": "ask", "paid_ceiling_usd_per_day": 1.0, "approval_wait_s": 1}
    server = KEYED if keyed else {}
    client = {"authorization": f"Bearer {CLIENT_KEY}"} if keyed else {}
    admin = {"authorization": f"Bearer {ADMIN_KEY}"} if keyed else {}
    async with open_sidecar(
        *LOCAL_AND_PAID, policy=ask, server=server, env={"ADMIN_KEY": ADMIN_KEY}
    ) as (url, fakes):
        fakes["local"].script("local-model", rate_limited(retry_after=600))
        base = url.removesuffix("/v1")
        async with httpx2.AsyncClient(trust_env=False, timeout=20) as http:

            async def held(prompt: str) -> httpx2.Response:
                return await http.post(
                    f"{url}/chat/completions",
                    json={"messages": [{"role": "user", "content": prompt}]},
                    headers=client,
                )

            approvals = []
            for prompt, decision in zip(PROMPTS, ("once", "1h"), strict=True):
                asked = await held(prompt)
                assert asked.status_code == 429, asked.text
                approvals.append(asked.json()["error"]["approval_id"])
                decided = await http.post(
                    f"{url}/approvals/{approvals[-1]}", json={"decision": decision}, headers=admin
                )
                assert decided.status_code == 200, decided.text
            before = (await http.get(f"{url}/grants", headers=client)).json()["data"]
            who = "alice" if keyed else "anonymous"
            ids = [f"grant-{who}", approvals[0]]
            keys = (CLIENT_KEY, ADMIN_KEY) if keyed else ()
            seen = await CHROME.run(
                revoke_in_browser, base, keys, ids, os.environ.get("LANES_PAGE_SCREENSHOT")
            )
            after = (await http.get(f"{url}/grants", headers=client)).json()["data"]
            asked_again = await held(PROMPTS[1])
    assert sorted(g["id"] for g in before) == sorted(ids)
    assert set(seen["rows"]) == set(ids)
    assert who in seen["rows"][ids[0]] and "any paid model" in seen["rows"][ids[0]]
    assert "once, on paid/paid-model" in seen["rows"][ids[1]] and who in seen["rows"][ids[1]]
    deletes = [r for r in seen["requests"] if r["method"] == "DELETE"]
    revoked = [r for r in deletes if r["headers"].get("authorization") != f"Bearer {CLIENT_KEY}"]
    assert [r["url"].removeprefix(base) for r in revoked] == [f"/v1/grants/{i}" for i in ids]
    for r in deletes:
        assert r["headers"]["content-type"] == "application/json" and r["body"] == "{}"
    if keyed:
        assert all(r["headers"]["authorization"] == f"Bearer {ADMIN_KEY}" for r in revoked)
        assert "401" in seen["without_key"] and "401" in seen["summary_without_key"]
        assert len(deletes) == len(ids) + 1  # the client key's attempt, refused
        assert "403" in seen["refused"][0] and "admin key" in seen["refused"][0]
        assert seen["rows_after_refusal"] == [len(ids)]
    assert after == [] and seen["notice"] == ""
    assert asked_again.status_code == 429  # the grant is gone, not only hidden
    assert all(r["url"].startswith(base) for r in seen["requests"])
    assert all(k not in r["url"] for r in seen["requests"] for k in (CLIENT_KEY, ADMIN_KEY))
    for secret in (*PROMPTS, CLIENT_KEY, ADMIN_KEY):
        assert secret not in seen["html"]
    assert not [m for m in seen["console"] if "Content Security Policy" in m], seen["console"]


def charts_in_browser(
    base: str, jobs: list[dict[str, Any]], screenshot: str | None
) -> dict[str, Any]:
    """Open the page before any job (it says "no jobs yet"), send `jobs` through the sidecar, wait
    until the audit has them, reload, and count what each chart drew."""
    seen: dict[str, Any] = {}
    with open_page(base, seen) as page:
        page.locator("#charts .none", has_text="no jobs yet").wait_for(timeout=SHOWN_MS)
        seen["empty_svgs"] = page.locator("#charts svg").count()
        with httpx2.Client(trust_env=False, timeout=20) as http:
            seen["csp"] = http.get(base + "/").headers["content-security-policy"]
            for job in jobs:
                response = http.post(f"{base}/v1/chat/completions", **job)
                assert response.status_code == 200, response.text
            for _ in range(100):  # the audit is written within about a second
                seen["report"] = http.get(f"{base}/v1/report?since=7d").json()
                if seen["report"]["total"]["jobs"] == len(jobs):
                    break
                time.sleep(0.1)
        page.reload()
        page.locator("figure[data-chart=attempts] svg").wait_for(timeout=SHOWN_MS)
        charts = page.locator("#charts figure.chart")
        seen["charts"] = [c.get_attribute("data-chart") for c in charts.all()]
        for chart, what in (
            ("share", "g.bucket"),
            ("share", "rect.bar"),
            ("spend", "rect.spend"),
            ("spend", "line.ceiling"),
            ("latency", "rect.latency"),
            ("attempts", "circle.point"),
        ):
            seen[f"{chart} {what}"] = page.locator(f"figure[data-chart={chart}] {what}").count()
        for chart in seen["charts"]:
            seen[f"{chart} text"] = page.locator(f"figure[data-chart={chart}]").inner_text()
            seen[f"{chart} svg text"] = page.locator(
                f"figure[data-chart={chart}] svg text"
            ).all_text_contents()
        if screenshot:
            page.screenshot(path=screenshot.replace(".png", "-charts.png"), full_page=True)
    return seen


async def test_the_page_draws_the_report_as_svg_charts():
    """Before any job the report says "no jobs yet"; after local and paid jobs the page draws four
    SVG charts from GET /v1/report — the free and paid shares per hour, paid spend per day against
    the ceiling, mean latency per route state, attempts per answer per hour — labelled with their
    units, one bar or point per figure, and nothing fetched from another origin."""
    await needs_a_browser()
    ceiling = {"free_tier_fallback": "allow", "paid_ceiling_usd_per_day": 1.0}
    hi = [{"role": "user", "content": "hi"}]
    jobs = [{"json": {"model": "local/local-model", "messages": hi}}] * 3 + [
        {"json": {"model": "paid/paid-model", "messages": hi}}
    ] * 2
    async with open_sidecar(*LOCAL_AND_PAID, policy=ceiling) as (url, fakes):
        seen = await CHROME.run(
            charts_in_browser,
            url.removesuffix("/v1"),
            jobs,
            os.environ.get("LANES_PAGE_SCREENSHOT"),
        )
    base = url.removesuffix("/v1")
    report, hours = seen["report"], seen["report"]["hours"]
    assert seen["empty_svgs"] == 0
    assert report["total"]["jobs"] == 5 and 1 <= len(hours) <= 2  # an hour may turn meanwhile
    assert seen["charts"] == ["share", "spend", "latency", "attempts"]
    # the shares: one column per hour, a free and a paid part in each
    free = sum(round(h["answered"] * h["free_share"]) for h in hours)
    paid = sum(round(h["answered"] * h["paid_share"]) for h in hours)
    assert (free, paid) == (3, 2)
    parts = sum(bool(h["free_share"]) + bool(h["paid_share"]) for h in hours)
    assert seen["share g.bucket"] == len(hours) and seen["share rect.bar"] == parts
    assert "% of the hour's jobs" in seen["share svg text"]
    assert "hour (UTC)" in seen["share svg text"]
    assert "free or local" in seen["share text"] and "paid fallback" in seen["share text"]
    # paid spend: a bar for each of the last 7 days, and the ceiling
    assert seen["spend rect.spend"] == 7 and seen["spend line.ceiling"] == 1
    assert {"ceiling $1.00", "US dollars per day", "day (UTC)"} <= set(seen["spend svg text"])
    assert report["total"]["paid_cost_usd"] > 0
    # latency: a bar per route state, named under it
    routes = report["total"]["latency_s_by_route"]
    assert set(routes) == {"local", "paid_fallback"} and seen["latency rect.latency"] == 2
    assert {"local", "paid_fallback", "milliseconds"} <= set(seen["latency svg text"])
    # attempts per answer: a point per hour with answers
    assert seen["attempts circle.point"] == len(hours)
    assert "attempts per answer" in seen["attempts svg text"]
    assert all(r["url"].startswith(base) for r in seen["requests"])  # no other origin
    policy = dict(part.strip().split(" ", 1) for part in seen["csp"].split(";"))
    assert policy["default-src"] == "'none'" and policy["connect-src"] == "'self'"
    assert policy["script-src"].startswith("'sha256-") and "unsafe" not in seen["csp"]
    assert not [m for m in seen["console"] if "Content Security Policy" in m], seen["console"]


def forecast_in_browser(base: str, screenshot: str | None) -> dict[str, Any]:
    """Open the page, wait until its forecast panel shows the free quota's rate, and read the
    panel: each quota's row, the paid day, the method; a picture of the panel when asked."""
    seen: dict[str, Any] = {}
    with open_page(base, seen) as page:
        rate = "#forecast tr.quota[data-scope='free/free-model']:not([data-outlook=no_rate])"
        page.locator(rate).first.wait_for(timeout=SHOWN_MS)
        seen["rows"] = {
            f"{r.get_attribute('data-scope')} {r.locator('td').nth(1).inner_text()}": (
                r.get_attribute("data-outlook"),
                r.inner_text(),
            )
            for r in page.locator("#forecast tr.quota").all()
        }
        seen["meters"] = page.locator("#forecast meter").count()
        seen["paid"] = page.inner_text("#forecast-paid")
        seen["method"] = page.inner_text("#forecast-method")
        seen["heading"] = page.inner_text("#forecast-panel h2")
        if screenshot:
            page.locator("#forecast-panel").screenshot(
                path=screenshot.replace(".png", "-forecast.png")
            )
    return seen


@pytest.mark.free_lane
async def test_the_page_shows_the_forecast_as_projections():
    """The forecast panel reads GET /v1/forecast: a row per quota with used / limit (a meter),
    the window, the last hour's rate and the sidecar's note — "projected", or "no use in the
    last hour" with no time — the paid day against its ceiling, and how it was all made."""
    await needs_a_browser()
    async with open_sidecar(*FORECAST_LANES, policy=FORECAST_POLICY) as (url, fakes):
        fakes["told"].script("big-model", answer(headers=DAY_HEADERS))
        async with httpx2.AsyncClient(trust_env=False, timeout=20) as http:
            await forecast_jobs(http, url, "free/free-model", 4)
            await forecast_jobs(http, url, "told/big-model", 1)
            await forecast_jobs(http, url, "paid/paid-model", 1)
            with trio.fail_after(20):  # the state sync writes the audit within a second
                while True:
                    forecast = (await http.get(f"{url}/forecast")).json()
                    if forecast["paid"]["rate_per_hour_usd"] is not None:
                        break
                    await trio.sleep(0.1)
        seen = await CHROME.run(
            forecast_in_browser, url.removesuffix("/v1"), os.environ.get("LANES_PAGE_SCREENSHOT")
        )
    rows = seen["rows"]
    assert set(rows) == {
        "free/free-model requests per day",
        "free/free-model tokens per day",
        "spare/spare-model requests per day",
        "told/big-model requests per day (reported)",
    }
    outlook, free = rows["free/free-model requests per day"]
    assert outlook in ("runs_out", "lasts")  # which, by how near UTC midnight the test runs
    assert "4 / 10" in free and "4 requests/h" in free and "projected" in free
    assert "at the last 60 min's rate: 4 requests/h" in free
    outlook, spare = rows["spare/spare-model requests per day"]
    assert outlook == "no_rate" and "0 / 50" in spare and "no use in the last hour" in spare
    assert "projected" not in spare
    assert "300 / 1,000" in rows["told/big-model requests per day (reported)"][1]
    assert seen["meters"] == 4
    assert seen["paid"].startswith("paid today: $0.0000") and "of $1.00" in seen["paid"]
    assert "projected $" in seen["paid"] and "at the last 60 min's rate: $" in seen["paid"]
    assert "last 60 min" in seen["method"] and "projected, not a fact" in seen["method"]
    assert "projected" in seen["heading"] and "not facts" in seen["heading"]
    assert not [m for m in seen["console"] if "Content Security Policy" in m], seen["console"]


def cache_in_browser(base: str) -> dict[str, Any]:
    """Open the page, wait until its forecast panel says what the response cache saved, read it."""
    seen: dict[str, Any] = {}
    with open_page(base, seen) as page:
        line = page.locator("#forecast-cache")
        line.wait_for(timeout=SHOWN_MS)
        seen["cache"] = line.inner_text()
    return seen


async def test_the_page_says_what_the_response_cache_saved():
    """With the response cache on, the forecast panel (an admin's view: no keys here) says the
    cache's mode, its hits and misses and the tokens and dollars its hits saved, as
    GET /v1/forecast counts them: one question asked twice is a miss, then a hit."""
    await needs_a_browser()
    ask = {
        "model": "auto",
        "messages": [{"role": "user", "content": "Say hi"}],
        "temperature": 0,
    }
    async with open_sidecar(LOCAL_AND_PAID[0], cache={"mode": "on"}) as (url, _fakes):
        async with httpx2.AsyncClient(trust_env=False, timeout=20) as http:
            made = await http.post(f"{url}/chat/completions", json=ask)
            hit = await http.post(f"{url}/chat/completions", json=ask)
            with trio.fail_after(20):  # the writer writes within its gathering window
                while True:
                    forecast = (await http.get(f"{url}/forecast")).json()
                    if forecast["cache"]["entries"]:
                        break
                    await trio.sleep(0.05)
        seen = await CHROME.run(cache_in_browser, url.removesuffix("/v1"))
    assert (made.headers["x-lanes-cache"], hit.headers["x-lanes-cache"]) == ("miss", "hit")
    counted = forecast["cache"]
    assert (counted["hits"], counted["misses"]) == (1, 1) and counted["saved_tokens"] > 0
    text = seen["cache"]
    assert text.startswith("response cache on: 1 hits, 1 misses; saved "), text
    assert f"saved {counted['saved_tokens']} tokens and $0.00" in text
    assert not [m for m in seen["console"] if "Content Security Policy" in m], seen["console"]


def click_through_a_frame(attacker: str) -> bool:
    """A user with a stock profile (third-party storage allowed) clicks a decoy on `attacker`,
    which frames the sidecar's page invisibly over it. False when the framed page never showed
    its switches (the browser refused to frame it)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    profile = Path(tempfile.mkdtemp(prefix="lanes-review-"))
    (profile / "Default").mkdir()
    (profile / "Default" / "Preferences").write_text(
        json.dumps({"profile": {"cookie_controls_mode": 0, "block_third_party_cookies": False}})
    )
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(profile),
            executable_path=CHROMIUM,
            args=[*FLAGS, "--disable-features=TrackingProtection3pcd"],
        )
        try:
            page = context.new_page()
            page.goto(attacker)
            button = page.frame_locator("iframe").locator("button.switch").first
            try:
                button.wait_for(timeout=5_000)
            except PlaywrightTimeout:
                return False
            box = button.bounding_box()
            assert box is not None
            page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            page.wait_for_timeout(1500)
            return True
        finally:
            context.close()
            shutil.rmtree(profile, ignore_errors=True)


async def test_a_framing_page_can_not_switch_a_lane_off(tmp_path):
    """The same, end to end in Chromium: a page on another origin (localhost:other-port) frames
    the console at opacity 0.05 over a decoy; the user's click switches the local lane off —
    under `allow`, every later job then pays."""
    await needs_a_browser()
    async with open_sidecar(*LOCAL_AND_PAID) as (url, _fakes):
        base = url.removesuffix("/v1")
        await trio.Path(tmp_path / "index.html").write_text(
            "<h1>Click the button to win</h1>"
            f'<iframe src="{base}/" width="1200" height="800" '
            'style="opacity:0.05;position:absolute;top:0;left:0"></iframe>'
        )
        handler = partial(SimpleHTTPRequestHandler, directory=str(tmp_path))
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            attacker = f"http://localhost:{server.server_address[1]}/index.html"
            clicked = await trio.to_thread.run_sync(click_through_a_frame, attacker)
        finally:
            await trio.to_thread.run_sync(server.shutdown)
            server.server_close()
        async with http_client() as http:
            lanes_now = (await http.get(f"{url}/lanes")).json()["lanes"]
    assert not clicked and not any(lane["off"] for lane in lanes_now), lanes_now


def read_the_console(base: str) -> str:
    """Open the page, enter the admin key, and read its summary line."""
    with open_page(base, {}) as page:
        page.fill("#admin-key", ADMIN_KEY)
        page.click("#admin-save")
        page.wait_for_function(
            "document.getElementById('summary').textContent !== 'loading…'", timeout=SHOWN_MS
        )
        page.wait_for_timeout(1_500)  # a refresh after the key was entered
        text: str = page.locator("#summary").inner_text()
        return text


async def test_the_console_works_when_client_keys_are_configured():
    """With `[server.clients]` set, the page reads `/v1/lanes` and `/v1/approvals` without a key:
    both answer 401 and the page says "sidecar unreachable" — no lanes, no approvals, nothing to
    click — even after the admin key is entered."""
    await needs_a_browser()
    async with open_sidecar(
        ("local", "local", ["local-model"]), server=KEYED, env={"ADMIN_KEY": ADMIN_KEY}
    ) as (url, _fakes):
        summary = await CHROME.run(read_the_console, url.removesuffix("/v1"))
    assert "free lane" in summary


def batches_in_browser(base: str, screenshot: str | None) -> dict[str, Any]:
    """Open the page, wait for the batch's row, read the panel; a picture of it when asked."""
    seen: dict[str, Any] = {}
    with open_page(base, seen) as page:
        page.locator("#batches tr.batch").first.wait_for(timeout=SHOWN_MS)
        seen["rows"] = [
            (r.get_attribute("data-batch"), r.get_attribute("data-outlook"), r.inner_text())
            for r in page.locator("#batches tr.batch").all()
        ]
        seen["bars"] = page.locator("#batches .batch-bar span").count()
        seen["heading"] = page.inner_text("#batches-panel h2")
        if screenshot:
            page.locator("#batches-panel").screenshot(
                path=screenshot.replace(".png", "-batches.png")
            )
    return seen


@pytest.mark.free_lane
async def test_the_page_shows_each_batch_with_its_projection():
    """A batch of 10 on a free model with rpd = 10 and the headroom 0.2 runs 8 items and waits
    for the next UTC day: the page's batch panel shows its row — 8 done, 0 failed, 2 left as a
    bar, its pace, $0.00 paid — and the sidecar's note that its items wait until midnight."""
    import io

    import openai

    await needs_a_browser()
    lane = ("free", "free", ["free-model"], {"free_tier": {"kind": "rate_limited", "rpd": 10}})
    async with open_sidecar(lane, batch={"concurrency": 1}) as (url, fakes):
        client = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)
        lines = "".join(
            json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                        "body": {"model": "free-model", "messages": [
                            {"role": "user", "content": f"classify {i}"}]}}) + "\n"
            for i in range(10)
        )  # fmt: skip
        file = await client.files.create(
            file=("in.jsonl", io.BytesIO(lines.encode())), purpose="batch"
        )
        batch = await client.batches.create(
            input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        with trio.fail_after(30):  # polled as a user would, until the 8 are counted
            counts = (await client.batches.retrieve(batch.id)).request_counts
            while counts is None or counts.completed < 8:
                await trio.sleep(0.05)
                counts = (await client.batches.retrieve(batch.id)).request_counts
            async with httpx2.AsyncClient(trust_env=False) as http:  # and both left put back
                outlook = (await http.get(f"{url}/forecast")).json()["batches"][0]
                while outlook["next_try_at"] is None:
                    await trio.sleep(0.05)
                    outlook = (await http.get(f"{url}/forecast")).json()["batches"][0]
        seen = await CHROME.run(
            batches_in_browser, url.removesuffix("/v1"), os.environ.get("LANES_PAGE_SCREENSHOT")
        )
    (row,) = seen["rows"]
    assert row[0] == batch.id and row[1] in ("finishes", "expires")
    assert "8 / 0 / 2" in row[2] and "$0.00" in row[2] and "wait until" in row[2]
    assert "/v1/chat/completions" in row[2] and "items/h" in row[2]
    assert seen["bars"] == 3 and "never paid" in seen["heading"]
    assert not [m for m in seen["console"] if "Content Security Policy" in m], seen["console"]


def configured_in_browser(base: str) -> dict[str, str]:
    """Each lane row's text, by lane, once the lanes are drawn."""
    seen: dict[str, Any] = {}
    with open_page(base, seen) as page:
        page.locator('#lanes tr[data-lane="empty"]').wait_for(timeout=SHOWN_MS)
        page.locator('#lanes tr[data-lane="down"]').first.wait_for(timeout=SHOWN_MS)
        return {
            lane: page.locator(f'#lanes tr[data-lane="{lane}"]').first.inner_text()
            for lane in ("local", "down", "empty")
        }


async def test_the_page_lists_every_configured_lane_and_marks_the_unreachable():
    """Issue 42: the page showed a lane whose server refused every connection as serving and
    left out lanes with no model listed yet, which `lanes status` lists. Every configured lane
    has a row; an unreachable one says so, one with no models says why."""
    await needs_a_browser()
    closed = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    lanes_: tuple[tuple[Any, ...], ...] = (
        ("local", "local", ["local-model"]),
        ("down", "local", ["down-model"], {"base_url": closed}),
        ("empty", "local", [], {"models": [], "discover": True}),  # its server lists none
    )
    async with open_sidecar(*lanes_) as (url, _):
        async with httpx2.AsyncClient(trust_env=False, timeout=20) as http:
            with trio.fail_after(30):  # the first catalog refresh finds the closed port
                while True:
                    view = (await http.get(f"{url}/lanes")).json()
                    states = {c["name"]: c["state"] for c in view["configured"]}
                    if states.get("down") == "unreachable":
                        break
                    await trio.sleep(0.2)
        rows = await CHROME.run(configured_in_browser, url.removesuffix("/v1"))
    assert states["empty"] == "no_models"
    assert "unreachable" in rows["down"]
    assert "unreachable" not in rows["local"]
    assert "no models" in rows["empty"]

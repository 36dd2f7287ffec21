"""The status page in a real headless Chromium: a pending approval appears, a click approves it, and
the held request completes."""

from __future__ import annotations

import os
import shutil
from typing import Any

import httpx2
import pytest
import trio

from lanes.testing import rate_limited
from sidecar import open_sidecar

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


def approve_in_browser(base: str, screenshot: str | None) -> str:
    """Open the page, wait for the pending approval, click "Approve once"; return what it showed."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page()
            page.goto(base + "/")
            approval = page.locator("div.approval").first
            approval.wait_for(timeout=10_000)
            shown = approval.inner_text()
            approval.get_by_role("button", name="Approve once").click()
            page.locator("#approvals .none").wait_for(timeout=10_000)
            page.get_by_text("paid_fallback").first.wait_for(timeout=10_000)
            if screenshot:
                page.screenshot(path=screenshot, full_page=True)
            return shown
        finally:
            browser.close()


@pytest.mark.free_lane
async def test_approve_a_held_request_from_the_page():
    """A job held for approval appears on the page; clicking Approve once lets it through."""
    if not await trio.Path(CHROMIUM).exists():
        pytest.skip(
            "Debian's chromium is not installed and could not be (make browser needs root and apt)"
        )
    pytest.importorskip(
        "playwright.sync_api", reason="playwright is a test dependency; reinstall with make install"
    )
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
            shown = await trio.to_thread.run_sync(
                approve_in_browser, base, os.environ.get("LANES_PAGE_SCREENSHOT")
            )
    response = box["response"]
    assert "paid/paid-model" in shown and "free/free-model" in shown
    assert response.status_code == 200 and response.headers["x-lanes-route"] == "paid_fallback"
    assert len(fakes["paid"].requests()) == 1


def drive_the_console(base: str, screenshot: str | None) -> dict[str, Any]:
    """Enter an admin key, switch a lane off and on from its row, read the recent jobs and the
    canary column; return what was seen and every request the page made."""
    from playwright.sync_api import sync_playwright

    seen: dict[str, Any] = {"requests": []}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page()
            page.on(
                "request",
                lambda r: seen["requests"].append(
                    {"method": r.method, "url": r.url, "headers": r.headers, "body": r.post_data}
                ),
            )
            page.goto(base + "/")
            page.fill("#admin-key", "k-admin-page")
            page.click("#admin-save")
            switch = page.locator("button.switch[data-lane=local]")
            switch.wait_for(timeout=10_000)
            assert switch.inner_text() == "Switch off"
            switch.click()
            page.locator("button.switch[data-lane=local]", has_text="Switch on").wait_for(
                timeout=10_000
            )
            seen["row_off"] = page.locator("tr[data-lane=local]").first.inner_text()
            page.locator("button.switch[data-lane=local]").click()
            page.locator("button.switch[data-lane=local]", has_text="Switch off").wait_for(
                timeout=10_000
            )
            page.locator(".quarantined").first.wait_for(timeout=10_000)
            seen["quarantined_row"] = page.locator("tr[data-lane=paid]").first.inner_text()
            page.locator("#recent tr").first.wait_for(timeout=10_000)
            seen["recent"] = page.locator("#recent tr").first.inner_text()
            seen["stored_key"] = page.evaluate("sessionStorage.getItem('lanes-admin-key')")
            seen["url"] = page.url
            if screenshot:
                page.screenshot(path=screenshot, full_page=True)
        finally:
            browser.close()
    return seen


async def test_the_console_switches_lanes_and_shows_jobs(tmp_path):
    """The page's kill-switch toggles send JSON with the admin key as a Bearer token (never in a
    URL), the lane goes off and on; recent jobs show request id, model, client, cohort, latency
    and cost; a quarantined model is marked; the page loads nothing from elsewhere."""
    if not await trio.Path(CHROMIUM).exists():
        pytest.skip(
            "Debian's chromium is not installed and could not be (make browser needs root and apt)"
        )
    pytest.importorskip(
        "playwright.sync_api", reason="playwright is a test dependency; reinstall with make install"
    )
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
        seen = await trio.to_thread.run_sync(
            drive_the_console, base, os.environ.get("LANES_PAGE_SCREENSHOT")
        )
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
    assert "off" in seen["row_off"] and seen["stored_key"] == "k-admin-page"
    assert "quarantined" in seen["quarantined_row"]
    request_id = job.headers["x-lanes-request-id"]
    for shown in (request_id[:12], "local-model", "anonymous", "nightly", " ms", "$0.000000"):
        assert shown in seen["recent"], seen["recent"]
    assert next(lane for lane in lanes_now["lanes"] if lane["name"] == "local")["off"] is False

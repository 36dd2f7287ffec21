"""The status page in a real headless Chromium: a pending approval appears, a click approves it, and
the held request completes."""

from __future__ import annotations

import os
import shutil

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

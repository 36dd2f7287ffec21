"""The page stays usable (issue 42, item 4), in a real headless Chromium: a section is redrawn only
when what it shows changed (its clocks left out), a control is never replaced under the pointer —
a press on "Switch off" held across refreshes switches the lane off — one refresh runs at a time,
a catalog of 5,000 models is rendered paged (first paint and the main thread's long tasks measured
with the browser's own `PerformanceObserver`), every time is UTC and says so, and a long model id
never widens the page past the window."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
import trio
from test_page import SHOWN_MS, Chromium, needs_a_browser

from sidecar import open_sidecar

pytestmark = pytest.mark.slow  # every test here drives Chromium

CHROME = Chromium()
LONG_ID = "vendor/" + "LongModelNameWithoutABreak_" * 8  # 223 characters, no break in them
LANES = (("local", "local", ["local-model", LONG_ID]), ("paid", "paid", ["paid-model"]))
BIG = 5000
#: The page's paging: at most this many rows of a lane are drawn until more are asked for.
PAGE_ROWS = 50

#: Before the page's own script: every long task (over 50 ms, the browser's definition), when the
#: lanes table first held a row of `big` and the frame after it (its first paint), and — `fetch`
#: wrapped — how many requests for /v1/lanes were in flight at most (with `SLOW_LANES_MS` set, each
#: is held that long first).
MEASURE = """
window.__perf = {long: [], keys: [], firstRow: null, firstPaint: null, inFlight: 0,
                 mostInFlight: 0, lanesAnswered: 0};
new PerformanceObserver((list) => {
  for (const e of list.getEntries())
    window.__perf.long.push({start: e.startTime, duration: e.duration});
}).observe({type: 'longtask', buffered: true});
new PerformanceObserver((list) => {  // a key press, from the event to the next frame painted
  for (const e of list.getEntries())
    if (e.name === 'keydown') window.__perf.keys.push(e.duration);
}).observe({type: 'event', durationThreshold: 16, buffered: true});
window.__perf.keysTyped = 0;
document.addEventListener('keydown', () => window.__perf.keysTyped++, true);
document.addEventListener('DOMContentLoaded', () => {
  const lanes = document.getElementById('lanes');
  new MutationObserver(() => {
    if (window.__perf.firstRow === null && lanes.querySelector('tr[data-lane=big]')) {
      window.__perf.firstRow = performance.now();
      requestAnimationFrame(() => setTimeout(() => window.__perf.firstPaint = performance.now()));
    }
  }).observe(lanes, {childList: true});
});
const realFetch = window.fetch.bind(window);
window.fetch = async (path, init) => {
  const lanes = String(path).startsWith('/v1/lanes') && !(init && init.method);
  if (!lanes) return realFetch(path, init);
  const p = window.__perf;
  p.inFlight++; p.mostInFlight = Math.max(p.mostInFlight, p.inFlight);
  try {
    if (window.SLOW_LANES_MS) await new Promise((r) => setTimeout(r, window.SLOW_LANES_MS));
    return await realFetch(path, init);
  } finally { p.inFlight--; p.lanesAnswered++; }
};
"""

#: Counts what is added to or removed from each section (a row, a cell, a control), and marks the
#: switch of `local`: a redraw would replace it.
WATCH = """() => {
  window.__replaced = {};
  for (const id of ['lanes', 'recent', 'approvals', 'grants', 'forecast', 'forecast-paid']) {
    window.__replaced[id] = 0;
    new MutationObserver((records) => {
      for (const r of records) window.__replaced[id] += r.addedNodes.length + r.removedNodes.length;
    }).observe(document.getElementById(id), {childList: true, subtree: true});
  }
  document.querySelector('button.switch[data-lane=local]').__marked = true;
}"""


#: The first /v1/lanes the page read: when it was asked (ms after navigation) and how long the
#: sidecar took to start answering (building a 1.6 MB view is the sidecar's time, not the page's).
LANES_TIMING = """() => {
  const e = performance.getEntriesByType('resource').find((r) => r.name.endsWith('/v1/lanes'));
  return {asked_ms: e.requestStart, sidecar_ms: e.responseStart - e.requestStart,
          received_ms: e.responseEnd};
}"""


@pytest.fixture(scope="module", autouse=True)
def chromium() -> Iterator[Chromium]:
    """The module's Chromium, closed after its last test."""
    try:
        yield CHROME
    finally:
        CHROME.close()


@contextlib.contextmanager
def open_page(base: str, *, slow_lanes_ms: int = 0, width: int = 1280) -> Iterator[Any]:
    """A fresh page at `base`, measured (`MEASURE`). In the Chromium thread (`CHROME.run`)."""
    context = CHROME.browser().new_context(viewport={"width": width, "height": 900})
    try:
        page = context.new_page()
        page.add_init_script(MEASURE + f"window.SLOW_LANES_MS = {slow_lanes_ms};")
        page.goto(base + "/")
        yield page
    finally:
        context.close()


def hold_and_release(page: Any, selector: str, hold_s: float) -> None:
    """Press the mouse on `selector`, hold it `hold_s` (refreshes run meanwhile), release."""
    box = page.locator(selector).bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.wait_for_timeout(hold_s * 1000)
    page.mouse.up()


def press_the_switch(base: str) -> dict[str, Any]:
    """Watch the sections through idle refreshes, then hold "Switch off" 1.5 s and release;
    then the same on "Switch on"; return what was seen."""
    seen: dict[str, Any] = {}
    with open_page(base) as page:
        switch = "button.switch[data-lane=local]"
        page.locator(switch, has_text="Switch off").wait_for(timeout=SHOWN_MS)
        page.wait_for_timeout(300)
        page.evaluate(WATCH)
        page.wait_for_timeout(6000)  # refreshes (the forecast's too), nothing changed but clocks
        seen["replaced_idle"] = page.evaluate("window.__replaced")
        seen["lanes_answered"] = page.evaluate("window.__perf.lanesAnswered")
        hold_and_release(page, switch, 1.5)
        page.locator(switch, has_text="Switch on").wait_for(timeout=SHOWN_MS)
        seen["same_switch"] = page.evaluate(f"document.querySelector('{switch}').__marked === true")
        seen["row_off"] = page.locator("tr[data-lane=local]").first.inner_text()
        hold_and_release(page, switch, 1.5)
        page.locator(switch, has_text="Switch off").wait_for(timeout=SHOWN_MS)
        seen["headers"] = page.locator("th").all_inner_texts()
        seen["overflow"] = page.evaluate(
            "document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        seen["recent"] = page.locator("#recent tr").first.inner_text()
    return seen


async def test_a_switch_held_across_refreshes_switches_the_lane():
    """Idle refreshes replace nothing in any section (their clocks change, their content does not);
    "Switch off" pressed for 1.5 s across refreshes switches the lane off, and it is the same
    button (relabelled "Switch on"), which switches it back on; job times are UTC, said so; a long
    model id does not widen the page past the window."""
    await needs_a_browser()
    async with (
        open_sidecar(*LANES) as (url, _),
        httpx2.AsyncClient(trust_env=False, timeout=20) as http,
    ):
        job = await http.post(
            f"{url}/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}
        )
        seen = await CHROME.run(press_the_switch, url[:-3])
        state = (await http.get(f"{url}/lanes")).json()
    assert seen["lanes_answered"] >= 3, seen
    assert seen["replaced_idle"] == dict.fromkeys(seen["replaced_idle"], 0), seen
    assert seen["same_switch"] and "off" in seen["row_off"], seen
    local = next(lane for lane in state["lanes"] if lane["name"] == "local")
    assert local["off"] is False  # switched off, then on again: both presses landed
    assert "when (UTC)" in seen["headers"]
    assert job.headers["x-lanes-request-id"][:12] in seen["recent"], seen["recent"]
    assert seen["overflow"] <= 0, seen


def overlapping(base: str) -> dict[str, Any]:
    """With each /v1/lanes held 2.5 s, press the switch twice a second apart (each asks for a
    refresh at once: the second while the first one's runs) and watch 7 s; return how many
    requests for /v1/lanes were in flight at most."""
    with open_page(base, slow_lanes_ms=2500) as page:
        page.locator("button.switch[data-lane=local]").wait_for(timeout=SHOWN_MS)
        page.click("button.switch[data-lane=local]")
        page.wait_for_timeout(1000)
        page.click("button.switch[data-lane=local]")
        page.wait_for_timeout(7000)
        return dict(page.evaluate("window.__perf"))


async def test_refreshes_never_overlap():
    """A refresh is never started while one runs, even when each takes 2.5 s (longer than the
    refresh period) and an action asks for one meanwhile."""
    await needs_a_browser()
    async with open_sidecar(*LANES) as (url, _):
        perf = await CHROME.run(overlapping, url[:-3])
    assert perf["lanesAnswered"] >= 2, perf
    assert perf["mostInFlight"] == 1, perf


def five_thousand(base: str) -> dict[str, Any]:
    """Open the page on 5,000 models: wait for its first paint, type a key every 200 ms through
    about 5 s of refreshes, hold
    "Switch off" 1.5 s, ask for the next rows once; return the measures."""
    seen: dict[str, Any] = {}
    with open_page(base) as page:
        page.locator("tr[data-lane=big]").first.wait_for(timeout=SHOWN_MS)
        page.wait_for_function("window.__perf.firstPaint !== null", timeout=SHOWN_MS)
        page.click("#admin-key")
        for key in "abcdefghijklmnopqrstuvwxyz":  # typed through about 5 s of refreshes
            page.keyboard.press(key)
            page.wait_for_timeout(200)
        seen["typed"] = page.input_value("#admin-key")
        page.wait_for_timeout(1000)
        seen["rows"] = page.locator("#lanes tr[data-lane=big]").count()
        hold_and_release(page, "button.switch[data-lane=local]", 1.5)
        page.locator("button.switch[data-lane=local]", has_text="Switch on").wait_for(
            timeout=SHOWN_MS
        )
        page.click("tr[data-lane=big] button.next")
        page.locator("tr[data-lane=big]", has_text="model-0050").wait_for(timeout=SHOWN_MS)
        page.wait_for_timeout(2500)
        seen["rows_next_page"] = page.locator("#lanes tr[data-lane=big]").count()
        seen["first_next_page"] = page.locator("#lanes tr[data-lane=big]").first.inner_text()
        seen["pager"] = page.locator("#lanes tr.pager").inner_text()
        seen["perf"] = dict(page.evaluate("window.__perf"))
        seen["lanes_timing"] = page.evaluate(LANES_TIMING)
    return seen


async def test_five_thousand_models_are_drawn_a_page_at_a_time():
    """A lane of 5,000 discovered models (`max_models = 5000`, all in `/v1/lanes`: 1.6 MB a
    refresh): the table is drawn paged (PAGE_ROWS rows of the lane, a row to turn the page), the
    first paint and Chromium's long tasks are measured and reported (`python -m bench.page`
    publishes them), keys typed meanwhile are echoed, and a press on "Switch off" held across
    refreshes switches the lane off."""
    await needs_a_browser()
    big = [f"vendor/model-{i:04d}:free" for i in range(BIG)]
    discovered = {"discover": True, "models": [], "max_models": BIG}
    async with (
        open_sidecar(
            *LANES, ("big", "local", big, discovered), metrics={"models_per_lane": BIG}
        ) as (url, _),
        httpx2.AsyncClient(trust_env=False, timeout=60) as http,
    ):
        with trio.fail_after(60):
            while True:
                state = (await http.get(f"{url}/lanes")).content
                lane = next(x for x in json.loads(state)["lanes"] if x["name"] == "big")
                if len(lane["models"]) == BIG:
                    break
                await trio.sleep(0.2)
        seen = await CHROME.run(five_thousand, url[:-3])
        local = (await http.get(f"{url}/lanes")).json()["lanes"][0]
    perf, timing = seen["perf"], seen["lanes_timing"]
    long_ms = sorted(round(t["duration"]) for t in perf["long"])
    report = {
        "lanes_bytes": len(state),
        "first_paint_ms": round(perf["firstPaint"]),
        "sidecar_ms": round(timing["sidecar_ms"]),
        "long_tasks": len(long_ms),
        "longest_ms": long_ms[-1] if long_ms else 0,
        # a key press to its frame on screen; under 16 ms is not recorded (the Event Timing API)
        "slowest_key_ms": round(max(perf["keys"], default=0)),
    }
    print("the page on 5,000 models:", report)
    if figures := os.environ.get("LANES_PAGE_FIGURES"):  # `python -m bench.page` asks for them
        at = [[round(t["start"]), round(t["duration"])] for t in perf["long"]]  # ms: start, length
        await trio.Path(figures).write_text(json.dumps(report | {"long_tasks_at_ms": at}))
    assert seen["rows"] == PAGE_ROWS + 1  # a page of the lane, and the row that turns it
    assert seen["rows_next_page"] == PAGE_ROWS + 1 and "model-0050" in seen["first_next_page"]
    assert "models 51–100 of 5,000" in seen["pager"], seen["pager"]
    assert local["name"] == "local" and local["off"] is True
    assert seen["typed"] == "abcdefghijklmnopqrstuvwxyz" and perf["keysTyped"] == 26, seen
    # The times themselves (first paint, the slowest key, Chromium's long tasks; before the
    # paging: 13 s to render, stalls of 12.8 s) are `python -m bench.page`'s, in
    # docs/benchmarks.md: held here as a second's margin, the first paint failed on a loaded
    # machine (1,072 ms, the suite beside it), and a time is no test's to hold

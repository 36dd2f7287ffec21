"""The `clock-step` drill: one process's day ahead, the ceiling holds."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx2
import trio

from lanes._core.runtime.wall import OFFSET_ENV
from lanes.drills.registry import Result, check, drill
from lanes.harness.configs import KEYS, paid_lane
from lanes.harness.processes import SidecarProcess, open_sidecar_process
from lanes.testing import answer, open_fake

MESSAGES = [{"role": "user", "content": "Drill: whose day is it?"}]
CEILING_USD = 0.002
DAY_S = 86400


def greedy_usage(request: Mapping[str, Any]) -> dict[str, int]:
    """Usage billing the most the request allows: a token per byte read, the whole output cap."""
    prompt = len(json.dumps(request.get("messages", [])).encode())
    cap = request.get("max_tokens")
    completion = cap if isinstance(cap, int) and cap > 0 else 100_000
    total = prompt + completion
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": total}


async def _story(http: httpx2.AsyncClient, sidecar: SidecarProcess, request_id: str) -> str:
    """The skips of one request's story, as `lanes explain` reads them (written within a sync)."""
    with trio.move_on_after(5):
        while True:
            found = await http.get(f"{sidecar.base}/v1/requests/{request_id}")
            if found.status_code == 200:
                return json.dumps(found.json().get("skips", []))
            await trio.sleep(0.1)
    return ""


@drill("clock-step")
async def clock_step(workdir: Path) -> Result:
    """Two sidecars on one state file, one's wall clock a day ahead: it closes paid and says \
why, once; the other pays; billed stays within one ceiling."""
    async with open_fake("paid", models=("paid-model",)) as paid:
        paid.script("paid-model", answer(usage=greedy_usage))
        config = {
            "state": str(workdir / "shared.db"),
            "policy": {"free_tier_fallback": "allow", "paid_ceiling_usd_per_day": CEILING_USD},
            "lanes": [paid_lane("paid", paid.base_url)],
        }
        (workdir / "right").mkdir(exist_ok=True)
        (workdir / "ahead").mkdir(exist_ok=True)
        async with (
            open_sidecar_process(config, workdir / "right", env=KEYS) as right,
            open_sidecar_process(
                config, workdir / "ahead", env={**KEYS, OFFSET_ENV: str(DAY_S)}
            ) as ahead,
            httpx2.AsyncClient(trust_env=False, timeout=20) as http,
        ):
            replies: list[tuple[str, httpx2.Response]] = []
            for i in range(24):
                sidecar, who = (right, "right") if i % 2 else (ahead, "ahead")
                body = {"messages": MESSAGES, "model": "paid/paid-model", "max_tokens": 100}
                reply = await http.post(f"{sidecar.base}/v1/chat/completions", json=body)
                replies.append((who, reply))
            refused_ahead = [r for who, r in replies if who == "ahead"]
            story = await _story(http, ahead, refused_ahead[0].headers["x-lanes-request-id"])
            views = {
                who: (await http.get(f"{s.base}/v1/lanes")).json()["clock"]
                for who, s in (("right", right), ("ahead", ahead))
            }
            logs = {"right": right.log(), "ahead": ahead.log()}
    billed = sum(float(r.headers["x-lanes-cost-usd"]) for _, r in replies if r.status_code == 200)
    served = {who: sum(r.status_code == 200 for w, r in replies if w == who) for who in views}
    lines = logs["ahead"].count("clock: this process's wall clock is 86400")
    return check(
        "clock-step",
        f"one sidecar a day ahead: served {served['ahead']} paid jobs there, "
        f"{served['right']} on the other; billed ${billed:.6f} of a ${CEILING_USD} ceiling; "
        f"{lines} clock line",
        ceiling_held=billed <= CEILING_USD + 1e-12 and len(paid.log) == served["right"],
        ahead_closed=served["ahead"] == 0
        and all(r.status_code == 429 for r in refused_ahead)
        and "ahead of the host's clock" in story,
        other_paid=served["right"] > 0,
        said_once=lines == 1 and "drill hook" in logs["ahead"],
        shown=views["ahead"]["agrees"] is False and views["right"]["agrees"] is True,
    )

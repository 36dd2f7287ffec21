"""Drill `batch-crash`: a batch's sidecar is SIGKILLed with items in flight and started again on
the same state file; the batch finishes with every item answered exactly once, and nothing paid
(a batch never pays, here with consent set to allow)."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
import trio

from lanes.drills.registry import Result, check, drill
from lanes.harness.configs import KEYS, local_lane, paid_lane
from lanes.harness.processes import open_sidecar_process
from lanes.testing import answer, open_fake

ITEMS = 24


def _file() -> bytes:
    lines = []
    for i in range(ITEMS):
        body = {"model": "auto", "messages": [{"role": "user", "content": f"classify {i}"}]}
        lines.append(json.dumps({"custom_id": f"item-{i}", "method": "POST",
                                 "url": "/v1/chat/completions", "body": body}))  # fmt: skip
    return ("\n".join(lines) + "\n").encode()


async def _batch(http: httpx2.AsyncClient, base: str, batch_id: str) -> dict[str, Any]:
    answer = await http.get(f"{base}/v1/batches/{batch_id}")
    found: dict[str, Any] = answer.json()
    return found


ENDED = ("completed", "failed", "expired", "cancelled")


async def _until(
    http: httpx2.AsyncClient, base: str, batch_id: str, done: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """The batch, polled (as a user would) until `done` says so."""
    while True:
        found = await _batch(http, base, batch_id)
        if done(found):
            return found
        await trio.sleep(0.05)


@drill("batch-crash")
async def batch_crash(workdir: Path) -> Result:
    """A batch's sidecar is SIGKILLed with items in flight and started again on the same state: \
every item answered exactly once, none paid."""
    auth = {"authorization": "Bearer drill"}
    async with (
        open_fake("local", models=("local-model",)) as local,
        open_fake("paid", models=("paid-model",)) as paid,
        httpx2.AsyncClient(trust_env=False, timeout=20, headers=auth) as http,
    ):
        local.script("local-model", *[answer(delay_s=0.15) for _ in range(ITEMS * 2)])
        config = {
            "state": str(workdir / "batch.db"),
            "policy": {"free_tier_fallback": "allow", "paid_ceiling_usd_per_day": 1.0},
            "batch": {"concurrency": 3},
            # owned capacity: the kill switch (FREE_LANE=off) leaves it serving
            "lanes": [local_lane("local", local.base_url), paid_lane("paid", paid.base_url)],
        }
        async with open_sidecar_process(config, workdir, env=KEYS) as first:
            files = {"file": ("in.jsonl", _file())}
            made = await http.post(f"{first.base}/v1/files", data={"purpose": "batch"}, files=files)
            ask = {"input_file_id": made.json()["id"], "endpoint": "/v1/chat/completions",
                   "completion_window": "1h"}  # fmt: skip
            batch_id = (await http.post(f"{first.base}/v1/batches", json=ask)).json()["id"]
            with trio.fail_after(20):  # a third done, one in flight at least: then it dies
                await _until(
                    http,
                    first.base,
                    batch_id,
                    lambda b: (
                        b["request_counts"]["completed"] >= ITEMS // 3
                        and len(local.requests()) > b["request_counts"]["completed"]
                    ),  # one in flight
                )
            sent_before = len(local.requests())
            first.process.send_signal(signal.SIGKILL)
            await first.process.wait()
        async with open_sidecar_process(config, workdir, env=KEYS) as second:
            with trio.fail_after(30):
                done = await _until(http, second.base, batch_id, lambda b: b["status"] in ENDED)
            output = b""
            if done.get("output_file_id"):
                output = (
                    await http.get(f"{second.base}/v1/files/{done['output_file_id']}/content")
                ).content
    ids = [json.loads(line)["custom_id"] for line in output.splitlines() if line.strip()]
    sent = len(local.requests())
    return check(
        "batch-crash",
        f"SIGKILL after {sent_before} items sent: finished {done['status']}, {len(ids)} answers "
        f"for {ITEMS} items ({len(set(ids))} distinct), {sent} sent upstream in all "
        f"({sent - ITEMS} again after the crash), {len(paid.requests())} paid",
        completed=done["status"] == "completed",
        each_once=sorted(ids) == sorted(f"item-{i}" for i in range(ITEMS)),
        none_paid=not paid.requests(),
    )

"""The connection drills, through a real `lanes serve`: clients that go away, and HTTP/2 floods.

- `client-gone`: a client leaves its job in every way HTTP/1.1 allows — closed, reset (SO_LINGER 0)
  or half-closed mid job, closed or reset mid stream, closed while its paid request is upstream,
  closed while a free attempt that will fail stands before a paid one. The fake upstream must see
  each request dropped within 100 ms of the client leaving; the paid request already sent is kept
  at its reservation, and the one not yet sent is never sent.
- `h2-flood`: 50 connections send the HTTP/2 preface and SETTINGS to a sidecar capped at 40
  connections; HTTP/2 is off, so each is answered 505 and closed, and `/health` answers within 1 s
  of the flood.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import attrs
import httpx2
import trio

from lanes.drills.registry import Result, check, drill
from lanes.harness.clients import (
    H2_PREFACE,
    H2_SETTINGS,
    Leaving,
    http_request,
    leave,
    read_until_closed,
)
from lanes.harness.configs import KEYS, local_lane, paid_lane
from lanes.harness.processes import open_sidecar_process
from lanes.testing import FakeProvider, answer, open_fake, status

MESSAGES = [{"role": "user", "content": "Drill: say the pangram."}]
RAN_ON_S = 0.1  # how long an upstream request may run on after its client left
HOSTILE = 50
#: (the case, how the client leaves, the model it asks for, streamed): every job takes the upstream
#: 2 s, or streams a chunk every 0.5 s, so a request that runs on is seen running.
CASES: tuple[tuple[str, Leaving, str, bool], ...] = (
    ("close mid job", "close", "local/slow", False),
    ("reset mid job", "reset", "local/slow", False),
    ("half-close mid job", "half-close", "local/slow", False),
    ("close mid stream", "close", "local/slow", True),
    ("reset mid stream", "reset", "local/slow", True),
    ("close, paid request upstream", "close", "paid/paid-model", False),
    ("close before the paid fallback", "close", "failing", False),
)


async def _leave_one(
    port: int, fake: FakeProvider, how: Leaving, model: str, stream: bool
) -> float | None:
    """One job left `how` once its upstream request is in: seconds the request ran on after the
    client left (None: it was never dropped — answered in full)."""
    body = {"model": model, "messages": MESSAGES, "max_tokens": 50, "stream": stream}
    before = len(fake.departed)
    client = await trio.open_tcp_stream("127.0.0.1", port)
    try:
        await client.send_all(http_request("POST", "/v1/chat/completions", body))
        with trio.fail_after(5):
            await fake.wait_for(lambda f: f.in_flight)
            if stream:  # the first chunk has reached the client
                received = b""
                while b"data: " not in received:
                    received += await client.receive_some(65536)
        left_at = trio.current_time()
        await leave(client, how)
        with trio.fail_after(10):
            await fake.wait_for(lambda f: not f.in_flight)
    finally:
        await client.aclose()
    return fake.departed[-1].at - left_at if len(fake.departed) > before else None


def _config(workdir: Path, local: FakeProvider, paid: FakeProvider) -> dict[str, Any]:
    return {
        "state": str(workdir / "state.db"),
        "scoring": {"explore_rate": 0.0},
        "aliases": {"failing": ["local/failing", "paid/paid-model"]},
        "policy": {"free_tier_fallback": "allow", "paid_ceiling_usd_per_day": 1.0},
        "lanes": [
            local_lane("local", local.base_url, ["slow", "failing"], breaker={"failures": 100}),
            paid_lane("paid", paid.base_url),
        ],
    }


@drill("client-gone")
async def client_gone(workdir: Path) -> Result:
    """Clients that close, reset or half-close mid job or mid stream: no upstream request runs on \
past 100 ms, a paid request sent is kept at its reservation, one not sent is never sent."""
    async with open_fake("local") as local, open_fake("paid") as paid:
        local.script("slow", answer(delay_s=2.0, chunk_delay_s=0.5))
        local.script("failing", attrs.evolve(status(503), delay_s=2.0))
        paid.script("paid-model", answer(delay_s=2.0))
        async with (
            open_sidecar_process(_config(workdir, local, paid), workdir, env=KEYS) as sidecar,
            httpx2.AsyncClient(trust_env=False, timeout=10) as http,
        ):
            port = int(sidecar.base.rsplit(":", 1)[1])
            ran_on: dict[str, float | None] = {}
            for name, how, model, stream in CASES:
                fake = paid if model.startswith("paid/") else local
                ran_on[name] = await _leave_one(port, fake, how, model, stream)
            state = (await http.get(f"{sidecar.base}/v1/lanes")).json()
        log = sidecar.log()
    outcomes = [job["outcome"] for job in state["recent"][: len(CASES)]]
    spent = state["paid"]["spent_today_usd"]
    paid_job = state["recent"][1]  # the newest but one: the paid request left upstream
    dropped = [s for s in ran_on.values() if s is not None]
    slowest = max(dropped, default=0.0)
    return check(
        "client-gone",
        f"{len(dropped)}/{len(CASES)} upstream requests dropped, the slowest "
        f"{slowest * 1000:.1f} ms after its client left; {outcomes.count('abandoned')} jobs "
        f"abandoned; paid: {len(paid.requests())} sent, ${spent:.6f} kept",
        all_dropped=len(dropped) == len(CASES),
        within_100_ms=slowest <= RAN_ON_S,
        all_abandoned=outcomes == ["abandoned"] * len(CASES),
        paid_sent_once=len(paid.requests()) == 1,
        paid_kept=spent > 0 and abs(spent - paid_job["cost_usd"]) < 1e-12,
        no_traceback="Traceback" not in log,
    )


@drill("h2-flood")
async def h2_flood(workdir: Path) -> Result:
    """50 connections open with the HTTP/2 preface against a cap of 40: HTTP/2 is off, each is \
answered 505 and closed, and /health answers within 1 s of the flood."""
    async with open_fake("local", models=("local-model",)) as local:
        config = {
            "state": ":memory:",
            "server": {"max_connections": 40},
            "lanes": [local_lane("local", local.base_url)],
        }
        async with (
            open_sidecar_process(config, workdir) as sidecar,
            httpx2.AsyncClient(trust_env=False, timeout=5) as http,
        ):
            port = int(sidecar.base.rsplit(":", 1)[1])
            answers: list[bytes] = []
            start = time.monotonic()  # wall-clock: the drill measures real answer times

            async def hostile() -> None:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                async with stream:
                    await stream.send_all(H2_PREFACE + H2_SETTINGS)
                    with trio.move_on_after(10):
                        answers.append(await read_until_closed(stream))

            async with trio.open_nursery() as nursery:
                for _ in range(HOSTILE):
                    nursery.start_soon(hostile)
            flood_s = time.monotonic() - start  # wall-clock: as above
            after = time.monotonic()  # wall-clock: as above
            health = await http.get(f"{sidecar.base}/health")
            # the flood's connections are let go as the sidecar reads their close: until then a
            # new one may find the cap full (503) — within the second it must not
            while health.status_code != 200 and time.monotonic() - after < 1.0:  # wall-clock: ^
                await trio.sleep(0.05)
                health = await http.get(f"{sidecar.base}/health")
            health_s = time.monotonic() - after  # wall-clock: as above
        log = sidecar.log()
    refused = sum(a.startswith(b"HTTP/1.1 505") for a in answers)
    busy = sum(a.startswith(b"HTTP/1.1 503") for a in answers)
    return check(
        "h2-flood",
        f"{HOSTILE} HTTP/2 connections: {refused} answered 505 and closed, {busy} refused over the "
        f"cap, {HOSTILE - len(answers)} left open, in {flood_s:.2f} s; then /health "
        f"{health.status_code} in {health_s * 1000:.0f} ms",
        all_closed=len(answers) == HOSTILE and refused + busy == HOSTILE,
        http2_off=refused > 0,
        health=health.status_code == 200 and health_s < 1.0,
        no_traceback="Traceback" not in log,
    )

"""Two real `lanes serve` processes sharing one real redis-server, in front of loopback fakes.

(Redis killed mid-traffic and restarted empty is the `shared-state-lost` drill, which
`test_drills.py` runs as a test too.)

What several hosts need from shared state: one knock on a closed door for all of them, one paid
ceiling for all of them, one kill switch for all of them — and service that survives Redis going
away.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import httpx2
import pytest
import redis
import trio

from lanes._core.policy.spend import billed_bytes
from lanes.harness.configs import KEYS, free_lane, local_lane, paid_lane
from lanes.harness.processes import (
    SidecarProcess,
    open_sidecar_process,
    open_sidecar_processes,
)
from lanes.testing import answer, open_fake, rate_limited

pytestmark = pytest.mark.slow  # real `lanes serve` processes and redis-server

MESSAGES = [{"role": "user", "content": "Several sidecars: say the pangram."}]
OUTAGE = re.compile(r"state store: redis at .*serving on this host's view")


def two_sidecars(tmp_path: Path, url: str, lanes: list[dict[str, Any]], policy: dict[str, Any]):
    return open_sidecar_processes(
        {"state": url, "policy": policy, "scoring": {"explore_rate": 0.0}, "lanes": lanes},
        tmp_path,
        env=KEYS,
    )


def client() -> httpx2.AsyncClient:
    return httpx2.AsyncClient(
        trust_env=False, timeout=30, limits=httpx2.Limits(max_connections=250)
    )


async def chat(http: httpx2.AsyncClient, sidecar: SidecarProcess, **body: Any) -> httpx2.Response:
    return await http.post(
        f"{sidecar.base}/v1/chat/completions", json={"messages": MESSAGES, **body}
    )


async def burst(
    http: httpx2.AsyncClient, sidecars: list[SidecarProcess], count: int, **body: Any
) -> list[httpx2.Response]:
    """`count` concurrent clients, split evenly across the sidecars."""
    responses: list[httpx2.Response] = []

    async def one(i: int) -> None:
        responses.append(await chat(http, sidecars[i % len(sidecars)], **body))

    async with trio.open_nursery() as nursery:
        for i in range(count):
            nursery.start_soon(one, i)
    return responses


@pytest.mark.free_lane
async def test_200_clients_on_two_sidecars_knock_once_per_backoff_window(redis_server, tmp_path):
    """Two bursts of 200 clients split across two hosts, against a provider answering 429 +
    Retry-After: 2. The host that probes waits the 2 s out once (policy: no free alternative), so
    each burst may knock twice — but never twice in one window, across both hosts."""
    async with open_fake("free", models=("free-model",)) as free:
        free.script("free-model", rate_limited(retry_after=2))
        async with (
            two_sidecars(
                tmp_path,
                redis_server.url,
                [free_lane("free", free.base_url)],
                {"free_tier_fallback": "off"},
            ) as sidecars,
            client() as http,
        ):
            first = await burst(http, sidecars, 200)
            await trio.sleep(2.5)  # the window passes; both hosts may probe again
            second = await burst(http, sidecars, 200)
    times = [r.at for r in free.log]
    gaps = [later - earlier for earlier, later in zip(times, times[1:], strict=False)]
    assert {r.status_code for r in first + second} == {429}
    assert (
        2 <= len(times) <= 4
    )  # 400 clients: one request per window in each burst, plus the one wait
    assert min(gaps) >= 2.0  # never two knocks within one Retry-After window, whichever host


async def test_paid_fallbacks_from_two_sidecars_stay_under_one_ceiling(redis_server, tmp_path):
    """60 concurrent paid jobs on two hosts: one ceiling holds for both, all reservations settle."""
    sent = {"max_tokens": 50, "model": "paid-model", "messages": MESSAGES}  # the body as sent
    worst = (billed_bytes(sent) * 1.0 + 50 * 2.0) / 1e6  # every byte a token × $1 + 50 tokens × $2
    ceiling = 10.5 * worst  # room for ten reservations, not eleven
    async with open_fake("paid", models=("paid-model",)) as paid:
        paid.script(
            "paid-model", answer(delay_s=1.0)
        )  # every reservation is made before any settles
        async with (
            two_sidecars(
                tmp_path,
                redis_server.url,
                [paid_lane("paid", paid.base_url)],
                {"free_tier_fallback": "allow", "paid_ceiling_usd_per_day": ceiling},
            ) as sidecars,
            client() as http,
        ):
            responses = await burst(http, sidecars, 60, model="paid/paid-model", max_tokens=50)
            await trio.sleep(1.0)  # the settlements reach Redis
    served = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code == 429]
    assert len(served) + len(refused) == 60
    assert {r.json()["error"]["code"] for r in refused} == {"paid_budget_exhausted"}
    assert len(paid.log) == len(served)
    assert 10 <= len(served) < 20  # one ceiling: two separate ledgers would have let 20 through
    ledger = redis.Redis.from_url(redis_server.url, decode_responses=True)
    pico_usd = 0
    for key in ledger.keys("lanes:paid-total:*"):
        total = ledger.get(key)
        assert total is not None  # listed just above, and a day's total outlives this test
        pico_usd += int(total)
    spent = pico_usd / 1e12
    assert 0 < spent <= ceiling + 1e-12
    assert spent == pytest.approx(
        sum(float(r.headers["x-lanes-cost-usd"]) for r in served)
    )  # all settled


async def test_a_kill_switch_thrown_on_one_sidecar_holds_on_the_other(redis_server, tmp_path):
    """`lane off` on one host stops the other using it; `lane on` there reopens it on the first."""
    async with (
        open_fake("local", models=("local-model",)) as local,
        open_fake("paid", models=("paid-model",)) as paid,
        two_sidecars(
            tmp_path,
            redis_server.url,
            [local_lane("local", local.base_url), paid_lane("paid", paid.base_url)],
            {"free_tier_fallback": "allow"},
        ) as (a, b),
        client() as http,
    ):
        assert (await chat(http, b)).headers["x-lanes-lane"] == "local"
        assert (await http.post(f"{a.base}/v1/lanes/local/off", json={})).status_code == 200
        with trio.fail_after(5):
            while not await _off(http, b, "local"):  # noqa: ASYNC110  polls another process over HTTP
                await trio.sleep(0.01)
        before = len(local.log)
        served_by = (await chat(http, b)).headers["x-lanes-lane"]
        sent = len(local.log) - before
        assert (await http.post(f"{b.base}/v1/lanes/local/on", json={})).status_code == 200
        with trio.fail_after(5):
            while await _off(http, a, "local"):  # noqa: ASYNC110  polls another process over HTTP
                await trio.sleep(0.01)
        back = (await chat(http, a)).headers["x-lanes-lane"]
    assert (served_by, sent, back) == ("paid", 0, "local")
    assert "lane local: switched off by another process sharing the state" in b.log()


async def _off(http: httpx2.AsyncClient, sidecar: SidecarProcess, lane: str) -> bool:
    state = (await http.get(f"{sidecar.base}/v1/lanes")).json()
    return next(entry["off"] for entry in state["lanes"] if entry["name"] == lane)


async def test_a_sidecar_starts_and_serves_with_redis_down(redis_server, tmp_path):
    """Redis down at start: the sidecar serves, says so once, keeps paid closed till Redis is up."""
    redis_server.kill()
    async with (
        open_fake("local", models=("local-model",)) as local,
        open_fake("paid", models=("paid-model",)) as paid,
    ):
        config = {
            "state": redis_server.url,
            "local_state": str(tmp_path / "local.db"),
            "policy": {"free_tier_fallback": "allow"},
            "lanes": [local_lane("local", local.base_url), paid_lane("paid", paid.base_url)],
        }
        async with open_sidecar_process(config, tmp_path, env=KEYS) as sidecar, client() as http:
            served = await chat(http, sidecar)
            refused = await chat(http, sidecar, model="paid/paid-model", max_tokens=20)
            down = (await http.get(f"{sidecar.base}/metrics")).text
            status_down = await trio.run_process(
                [sys.executable, "-m", "lanes", "status", "--url", sidecar.base],
                capture_stdout=True,
            )
            redis_server.start()
            with trio.fail_after(15):
                while (  # noqa: ASYNC110  polls another process until Redis is back
                    r := await chat(http, sidecar, model="paid/paid-model", max_tokens=20)
                ).status_code != 200:
                    await trio.sleep(0.1)
            up = (await http.get(f"{sidecar.base}/metrics")).text
    assert (served.status_code, served.headers["x-lanes-lane"]) == (200, "local")
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "paid_budget_exhausted"
    assert r.headers["x-lanes-lane"] == "paid"
    assert len(OUTAGE.findall(sidecar.log())) == 1
    assert (
        'lanes_state_store_up{kind="redis"} 0' in down
        and 'lanes_state_store_up{kind="redis"} 1' in up
    )
    assert (
        f"state redis {redis_server.url}: DOWN (paid fallback closed)"
        in status_down.stdout.decode()
    )


async def test_an_approval_granted_on_one_host_holds_on_the_other(redis_server, env):
    """Two dispatchers (two hosts) on one Redis: a one-hour grant decided on one lets the same
    client fall back to paid on the other without asking again."""
    import lanes
    from helpers import config

    async with open_fake("paid", models=("paid-model",)) as paid:
        cfg = config(
            paid_lane("paid", paid.base_url),
            state=redis_server.url,
            policy={
                "free_tier_fallback": "ask",
                "approval_wait_s": 0.01,
                "paid_ceiling_usd_per_day": 1.0,
            },
        )
        async with (
            lanes.open_dispatcher(cfg, env=env) as one,
            lanes.open_dispatcher(cfg, env=env) as other,
        ):
            with pytest.raises(lanes.FallbackNeedsApproval) as asked:
                await one.complete(lanes.Job(messages=MESSAGES, client="nightly"))
            await one.approvals.decide(asked.value.approval_id, 3600.0)
            with trio.fail_after(5):
                while not other.approvals.granted("nightly"):  # noqa: ASYNC110  the grant arrives via Redis, no event
                    await trio.sleep(0.01)
            reply = await other.complete(lanes.Job(messages=MESSAGES, client="nightly"))
            with pytest.raises(lanes.FallbackNeedsApproval):  # another client still asks
                await other.complete(lanes.Job(messages=MESSAGES, client="adhoc"))
    assert (reply.lane, len(paid.log)) == ("paid", 1)


@pytest.mark.parametrize("store", ["sqlite", "redis"])
async def test_200_greedy_fallbacks_over_two_processes_never_overshoot(store, request, tmp_path):
    """200 concurrent paid jobs asking n = 3, split over two sidecar processes sharing one state
    (a SQLite file, or Redis), against an upstream that bills the most the sent caps allow: what it
    bills stays under the one ceiling, and the shared ledger is never below it."""
    from test_money import billed, greedy

    state = str(tmp_path / "shared.db")
    if store == "redis":
        state = request.getfixturevalue("redis_server").url
    ceiling = 0.01
    async with open_fake("paid", models=("paid-model",)) as paid:
        paid.script("paid-model", answer(delay_s=1.0, usage=greedy()))
        policy = {
            "free_tier_fallback": "allow",
            "paid_ceiling_usd_per_day": ceiling,
            "paid_max_tokens": 40,
        }
        async with (
            two_sidecars(tmp_path, state, [paid_lane("paid", paid.base_url)], policy) as sidecars,
            client() as http,
        ):
            responses = await burst(http, sidecars, 200, model="paid/paid-model", n=3)
            await trio.sleep(1.0)  # the settlements reach the store
            views = [(await http.get(f"{s.base}/v1/lanes")).json() for s in sidecars]
    served = [r for r in responses if r.status_code == 200]
    bills = [billed(dict(r.body)) for r in paid.requests()]
    assert len(served) == len(bills) and 0 < len(served) < 200
    assert sum(bills) <= ceiling + 1e-12
    assert all(v["paid"]["spent_today_usd"] >= sum(bills) - 1e-9 for v in views)


@pytest.mark.parametrize("store", ["sqlite", "redis"])
async def test_one_approve_once_pays_for_one_job_across_two_processes(store, request, tmp_path):
    """The same request waits for approval on two sidecar processes sharing one state (a SQLite
    file, or Redis); one "approve once" decided on the second pays for exactly one of the two
    jobs, and the other is asked again at once, with a fresh approval — whichever process wins."""
    state = str(tmp_path / "shared.db")
    if store == "redis":
        state = request.getfixturevalue("redis_server").url
    async with open_fake("paid", models=("paid-model",)) as paid:
        policy = {"free_tier_fallback": "ask", "approval_wait_s": 20}
        async with (
            two_sidecars(tmp_path, state, [paid_lane("paid", paid.base_url)], policy) as sidecars,
            client() as http,
        ):
            replies: list[httpx2.Response] = []

            async def waits(sidecar: SidecarProcess) -> None:
                replies.append(await chat(http, sidecar))

            async def listed(sidecar: SidecarProcess, waiting: int) -> list[dict[str, Any]]:
                """Its pending approvals, once one has `waiting` jobs of that process on it."""
                with trio.fail_after(10):
                    while True:
                        view = (await http.get(f"{sidecar.base}/v1/approvals")).json()["data"]
                        if view and view[0]["waiting"] >= waiting:
                            return list(view)
                        await trio.sleep(0.05)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(waits, sidecars[0])
                [asked] = await listed(sidecars[1], waiting=0)  # the first process's, shared
                nursery.start_soon(waits, sidecars[1])
                [joined] = await listed(sidecars[1], waiting=1)
                await listed(sidecars[0], waiting=1)
                decided = await http.post(
                    f"{sidecars[1].base}/v1/approvals/{asked['id']}", json={"decision": "once"}
                )
            left = (await http.get(f"{sidecars[0].base}/v1/grants")).json()["data"]
    assert joined["id"] == asked["id"] and decided.status_code == 200
    assert sorted(r.status_code for r in replies) == [200, 429]
    [again] = [r.json()["error"] for r in replies if r.status_code == 429]
    assert again["code"] == "approval_required" and again["approval_id"] != asked["id"]
    assert len(paid.requests()) == 1 and left == []

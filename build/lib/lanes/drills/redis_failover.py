"""The `redis-failover` drill: Sentinel moves the master, and no reservation is lost."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx2
import redis
import trio

from lanes.drills.clock import greedy_usage
from lanes.drills.registry import Result, check, drill, without_redis
from lanes.harness.configs import KEYS, local_lane, paid_lane
from lanes.harness.processes import SidecarProcess, open_sidecar_processes
from lanes.harness.redis_server import RedisSentinels, RedisServer
from lanes.testing import answer, open_fake

MESSAGES = [{"role": "user", "content": "Drill: who is the master now?"}]
CEILING_USD = 0.004
PAID = {"messages": MESSAGES, "model": "paid/paid-model", "max_tokens": 100}


async def _ask(
    http: httpx2.AsyncClient, sidecar: SidecarProcess, body: dict[str, Any]
) -> httpx2.Response:
    return await http.post(f"{sidecar.base}/v1/chat/completions", json=body)


@drill("redis-failover")
async def redis_failover(workdir: Path) -> Result:
    """Two sidecars on `redis+sentinel://` with `state_redis_min_replicas = 1`, a master, two \
replicas and three sentinels; the master is SIGKILLed mid-traffic: local work is served \
throughout, paid closes until the sentinels promote a replica, every reservation made before is \
on the new master, and billed stays within one ceiling."""
    if (skipped := without_redis("redis-failover")) is not None:
        return skipped
    server = RedisServer(workdir / "redis").start()
    sentinels = RedisSentinels(server, workdir / "sentinels", replicas=2)
    try:
        sentinels.start()
        async with (
            open_fake("local", models=("local-model",)) as local,
            open_fake("paid", models=("paid-model",)) as paid,
            httpx2.AsyncClient(trust_env=False, timeout=20) as http,
        ):
            paid.script("paid-model", answer(usage=greedy_usage))
            config = {
                "state": sentinels.url,
                "state_redis_min_replicas": 1,
                "scoring": {"explore_rate": 0.0},
                "policy": {"free_tier_fallback": "allow", "paid_ceiling_usd_per_day": CEILING_USD},
                "lanes": [local_lane("local", local.base_url), paid_lane("paid", paid.base_url)],
            }
            async with open_sidecar_processes(config, workdir, env=KEYS) as sidecars:
                before = [(await _ask(http, sidecars[i % 2], PAID)) for i in range(4)]
                billed = sum(float(r.headers.get("x-lanes-cost-usd") or 0) for r in before)
                server.kill()
                killed = time.monotonic()  # wall-clock: the failover runs in real time
                local_statuses, paid_during = [], []
                while sentinels.master_port() == server.port:
                    if time.monotonic() - killed > 30:  # wall-clock: as above
                        break
                    for sidecar in sidecars:
                        local_statuses.append(
                            (await _ask(http, sidecar, {"messages": MESSAGES})).status_code
                        )
                    paid_during.append((await _ask(http, sidecars[0], PAID)).status_code)
                    await trio.sleep(0.2)
                promoted_s = time.monotonic() - killed  # wall-clock: as above
                reopened_s: float | None = None
                after: list[httpx2.Response] = []
                with trio.move_on_after(30):
                    while True:
                        reply = await _ask(http, sidecars[len(after) % 2], PAID)
                        after.append(reply)
                        if reply.status_code == 200 and reopened_s is None:
                            reopened_s = time.monotonic() - killed  # wall-clock: as above
                        if reply.status_code == 429 and reopened_s is not None:
                            break  # the ceiling
                        await trio.sleep(0.2)
                billed += sum(float(r.headers.get("x-lanes-cost-usd") or 0) for r in after)
            sent = len(paid.log)
        master = redis.Redis(port=sentinels.master_port(), decode_responses=True)
        day = int(time.time() // 86400)  # wall-clock: the server's UTC day, as the ledger's key
        kept = master.hlen(f"lanes:paid:{day}")
    finally:
        sentinels.stop()
        server.stop()
    served_before = sum(r.status_code == 200 for r in before)
    return check(
        "redis-failover",
        f"master killed: promoted in {promoted_s:.1f} s, paid open again {reopened_s or 0:.1f} s "
        f"after; local {local_statuses.count(200)}/{len(local_statuses)} served meanwhile, paid "
        f"{paid_during.count(200)}/{len(paid_during)}; {kept} reservations on the new master "
        f"({served_before} paid before the kill); billed ${billed:.6f} of ${CEILING_USD}",
        before=served_before == 4,
        local_served=bool(local_statuses) and set(local_statuses) == {200},
        paid_closed_meanwhile=200 not in paid_during,
        reopened=reopened_s is not None,
        none_lost=kept >= served_before + sum(r.status_code == 200 for r in after),
        ceiling_held=billed <= CEILING_USD + 1e-12
        and sent == served_before + sum(r.status_code == 200 for r in after),
    )

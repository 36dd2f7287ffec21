"""The `redis-evict` drill: an evicting Redis and a noisy neighbour never spend the day twice."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx2
import redis
import trio

from lanes.drills.clock import greedy_usage
from lanes.drills.registry import Result, check, drill, without_redis
from lanes.harness.configs import KEYS, local_lane, paid_lane
from lanes.harness.processes import open_sidecar_process, open_sidecar_processes
from lanes.harness.redis_server import RedisServer
from lanes.testing import answer, open_fake

MESSAGES = [{"role": "user", "content": "Drill: is the day's spend still there?"}]
CEILING_USD = 0.004
EVICTING = "maxmemory-policy is allkeys-lru"


def _neighbour(url: str, stop: threading.Event) -> None:
    """Another application on the same server: 2 KB keys with an hour's expiry, as fast as it can
    (a blocking client, in a thread of its own)."""
    client, batch = redis.Redis.from_url(url), 0
    while not stop.is_set():
        pipe = client.pipeline(transaction=False)
        for i in range(50):
            pipe.set(f"neighbour:{batch}:{i}", "x" * 2000, ex=3600)
        pipe.execute()
        batch += 1


@drill("redis-evict")
async def redis_evict(workdir: Path) -> Result:
    """Redis with a 3 MB limit and `volatile-lru`, a neighbour writing expiring keys until it \
evicts thousands, two sidecars paying under one ceiling: billed stays within it; a sidecar \
started under `allkeys-lru` keeps paid closed and says so in one line, and local work serves."""
    if (skipped := without_redis("redis-evict")) is not None:
        return skipped
    server = RedisServer(
        workdir / "redis", None, "--maxmemory", "3mb", "--maxmemory-policy", "volatile-lru"
    ).start()
    stop = threading.Event()
    try:
        async with (
            open_fake("local", models=("local-model",)) as local,
            open_fake("paid", models=("paid-model",)) as paid,
            httpx2.AsyncClient(trust_env=False, timeout=20) as http,
        ):
            paid.script("paid-model", answer(usage=greedy_usage))
            config = {
                "state": server.url,
                "scoring": {"explore_rate": 0.0},
                "policy": {"free_tier_fallback": "allow", "paid_ceiling_usd_per_day": CEILING_USD},
                "lanes": [local_lane("local", local.base_url), paid_lane("paid", paid.base_url)],
            }
            body = {"messages": MESSAGES, "model": "paid/paid-model", "max_tokens": 100}
            billed, statuses = 0.0, []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.to_thread.run_sync, _neighbour, server.url, stop)
                async with open_sidecar_processes(config, workdir, env=KEYS) as sidecars:
                    for i in range(60):
                        sidecar = sidecars[i % 2]
                        reply = await http.post(f"{sidecar.base}/v1/chat/completions", json=body)
                        statuses.append(reply.status_code)
                        billed += float(reply.headers.get("x-lanes-cost-usd") or 0)
                        await trio.sleep(0.05)
                stop.set()
            info = redis.Redis.from_url(server.url).info("stats")
            evicted = int(info.get("evicted_keys", 0))
            redis.Redis.from_url(server.url).config_set("maxmemory-policy", "allkeys-lru")
            late = workdir / "late"
            late.mkdir(exist_ok=True)
            async with open_sidecar_process(
                {**config, "local_state": str(late / "local.db")}, late, env=KEYS
            ) as third:
                refused = await http.post(f"{third.base}/v1/chat/completions", json=body)
                served = await http.post(
                    f"{third.base}/v1/chat/completions", json={"messages": MESSAGES}
                )
                lines = [x for x in third.log().splitlines() if EVICTING in x]
                said = sum("state store:" in x for x in lines)  # the paid ledger's, once
                queue_said = sum("batch queue:" in x for x in lines)  # the batch queue's, once
            sent = len(paid.log)
    finally:
        stop.set()
        server.stop()
    return check(
        "redis-evict",
        f"{evicted} keys evicted under volatile-lru; billed ${billed:.6f} of a ${CEILING_USD} "
        f"ceiling over two sidecars ({statuses.count(200)} paid answers of {len(statuses)}); "
        f"under allkeys-lru: paid {refused.status_code}, local {served.status_code}, "
        f"{said} line (and {queue_said} of the batch queue)",
        evicted=evicted > 1000,
        ceiling_held=billed <= CEILING_USD + 1e-12 and sent == statuses.count(200),
        paid_reached_the_ceiling=statuses.count(200) > 0 and 429 in statuses,
        allkeys_closed=refused.status_code == 429 and said == 1,
        queue_warned=queue_said == 1,
        local_served=served.status_code == 200,
    )

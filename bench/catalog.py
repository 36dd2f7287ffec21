"""A large discovered catalog: what it costs a job that a local lane serves, and what it adds to
the operations views. `python -m bench.catalog [--models N] [--jobs J]`.

One in-process sidecar over two fakes on loopback: a local lane with one model, which serves
every `auto` job, and a discovered free lane whose `GET /models` lists N free models. Prints, as
JSON: the `auto` p50 and p99 (ms, through HTTP) and the CPU per job (ms, the client's included —
on a shared machine the steadier figure); the bytes of `/metrics`, `/v1/lanes` and `/v1/models`
(whole, and a page of 100); the process' peak RSS (MB). Run it once with `--models 0` for the
baseline: RSS is the process' peak, so each size needs a process of its own.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from typing import Any

import httpx2
import trio

from lanes import load_config
from lanes._http.server import serve
from lanes.harness.configs import KEYS, free_lane, local_lane
from lanes.testing import open_fake

JOB = {"model": "auto", "messages": [{"role": "user", "content": "Benchmark: say the pangram."}]}


async def measure(models: int, jobs: int, max_models: int | None) -> dict[str, Any]:
    async with (
        open_fake("local", models=("local-model",)) as local,
        open_fake("big") as big,
        trio.open_nursery() as nursery,
    ):
        big.catalog = [{"id": f"vendor/model-{i}:free", "object": "model"} for i in range(models)]
        config = load_config(
            {
                "lanes": [
                    local_lane("local", local.base_url),
                    {
                        **free_lane("big", big.base_url, discover=True),
                        "models": [],
                        **({"max_models": max_models} if max_models else {}),
                    },
                ],
                "scoring": {"explore_rate": 0.0},
                "server": {"port": 0},
            },
            env={},
        )
        url = await nursery.start(
            lambda task_status: serve(config, env=KEYS, task_status=task_status)
        )
        async with httpx2.AsyncClient(base_url=url, trust_env=False, timeout=30) as http:
            for _ in range(200):  # the startup catalog fetch
                lanes = (await http.get("/v1/lanes")).json()["lanes"]
                if len(next(x for x in lanes if x["name"] == "big")["models"]) or not models:
                    break
                await trio.sleep(0.05)
            for _ in range(20):  # warm-up
                await http.post("/v1/chat/completions", json=JOB)
            latencies = []
            cpu_before = time.process_time()
            for _ in range(jobs):
                started = time.perf_counter()
                reply = await http.post("/v1/chat/completions", json=JOB)
                latencies.append((time.perf_counter() - started) * 1000)
                assert reply.headers["x-lanes-lane"] == "local", reply.text
            cpu_ms = (time.process_time() - cpu_before) * 1000 / jobs
            sizes = {
                path: len((await http.get(path)).content)
                for path in ("/metrics", "/v1/lanes", "/v1/models", "/v1/models?limit=100")
            }
            listed, pages, params = 0, 0, {"limit": "100"}
            while True:  # every page of /v1/models, a cursor list's way (`has_more`, `after`)
                page = (await http.get("/v1/models", params=params)).json()
                listed, pages = listed + len(page["data"]), pages + 1
                if not page.get("has_more") or not page["data"]:
                    break
                params = {"limit": "100", "after": page["data"][-1]["id"]}
        nursery.cancel_scope.cancel()
    latencies.sort()
    return {
        "catalog_models": models,
        "max_models": max_models or "default",
        "jobs": jobs,
        "auto_p50_ms": round(statistics.median(latencies), 2),
        "auto_p99_ms": round(latencies[int(0.99 * (len(latencies) - 1))], 2),
        "cpu_ms_per_job": round(cpu_ms, 2),
        "metrics_bytes": sizes["/metrics"],
        "lanes_bytes": sizes["/v1/lanes"],
        "models_bytes": sizes["/v1/models"],
        "models_page_bytes": sizes["/v1/models?limit=100"],
        "models_listed": listed,
        "models_pages": pages,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=10_000)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--max-models", type=int, default=None, help="the lane's max_models")
    args = parser.parse_args()
    print(json.dumps(trio.run(measure, args.models, args.jobs, args.max_models)))


if __name__ == "__main__":
    main()

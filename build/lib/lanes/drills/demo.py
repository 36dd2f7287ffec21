"""`make run` for now: the dispatcher over fake providers on loopback, no keys, no network.

Three fakes — a local model that goes away, a free tier that starts rate-limiting, a paid
fallback — and ten jobs. Each line says which lane served the job, by which route, and why the
lanes before it did not.
"""

from __future__ import annotations

import logging

import trio

import lanes
from lanes.testing import answer, open_fake, rate_limited

JOBS = 10


def why(reply: lanes.Reply) -> str:
    notes = [f"{s.lane}: {s.reason}" for s in reply.skips]
    notes += [f"{a.lane}: {a.outcome} ({a.detail})" for a in reply.attempts if a.outcome != "ok"]
    return "; ".join(notes) or "first choice"


async def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="  log: %(message)s")
    async with (
        open_fake("local", models=("llama3.2:3b",)) as local,
        open_fake("free", models=("llama-3.1-8b-instant",)) as free,
        open_fake("paid", models=("gpt-4.1-mini",)) as paid,
    ):
        free.script(
            "llama-3.1-8b-instant", answer(), answer(), answer(), rate_limited(retry_after=30)
        )
        config = lanes.load_config(
            {
                "default_deadline_s": 8,
                "policy": {"free_tier_fallback": "allow", "paid_ceiling_usd_per_day": 0.05},
                "lanes": [
                    {
                        "name": "local",
                        "module": "ollama",
                        "base_url": local.base_url,
                        "models": [{"id": "llama3.2:3b"}],
                    },
                    {
                        "name": "free",
                        "module": "groq",
                        "base_url": free.base_url,
                        "api_key_env": "DEMO_FREE_KEY",
                        "models": [{"id": "llama-3.1-8b-instant"}],
                    },
                    {
                        "name": "paid",
                        "module": "openai",
                        "base_url": paid.base_url,
                        "api_key_env": "DEMO_PAID_KEY",
                        "models": [
                            {
                                "id": "gpt-4.1-mini",
                                "input_usd_per_mtok": 0.4,
                                "output_usd_per_mtok": 1.6,
                            }
                        ],
                    },
                ],
            },
            env={},
        )
        env = {"DEMO_FREE_KEY": "demo-free-key", "DEMO_PAID_KEY": "demo-paid-key"}
        print(f"lanes demo: {JOBS} jobs over local → free → paid fakes on 127.0.0.1\n")
        async with lanes.open_dispatcher(config, env=env) as dispatcher:
            for n in range(1, JOBS + 1):
                if n == 3:
                    print("  -- the local model server stops (connections refused) --")
                    await local.refuse()
                job = lanes.Job(messages=[{"role": "user", "content": f"job {n}"}], deadline_s=8)
                try:
                    reply = await dispatcher.complete(job)
                except lanes.JobFailed as exc:
                    print(f"job {n:2}: failed — {exc}")
                    continue
                print(
                    f"job {n:2}: {reply.lane:<5} route={reply.route:<13} "
                    f"attempts={len(reply.attempts)} "
                    f"cost=${reply.cost_usd:.6f}  why: {why(reply)}"
                )
            job = lanes.Job(messages=[{"role": "user", "content": "stream"}], deadline_s=8)
            async with dispatcher.open_stream(job) as stream:
                text = "".join(
                    [
                        c["choices"][0]["delta"].get("content") or ""
                        async for c in stream
                        if c["choices"]
                    ]
                )
            print(f"stream: {stream.lane} route={stream.route}: {text!r}")
        print(
            f"\nrequests received — local: {len(local.log)}, free: {len(free.log)}, "
            f"paid: {len(paid.log)}"
        )


if __name__ == "__main__":
    trio.run(main)

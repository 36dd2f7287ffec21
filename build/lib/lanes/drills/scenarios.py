"""The drills: pull the kill switch and break the providers on purpose, then measure what held.

Each drill is `async def drill(workdir) -> Result`; `lanes drill` runs them and prints one line
each, and the test suite runs each as a test. Everything is on 127.0.0.1; nothing reaches a real
provider.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import signal
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import attrs
import httpx2
import redis
import trio

from lanes.drills.registry import DRILLS, Drill, Result, check, drill, without_redis
from lanes.harness.configs import KEYS, free_lane, local_lane, open_sidecar, paid_lane
from lanes.harness.processes import (
    open_sidecar_process,
    open_sidecar_processes,
    open_sidecar_processes_at_once,
)
from lanes.harness.redis_server import RedisServer
from lanes.testing import (
    ANSWER,
    answer,
    hang,
    malformed_chunk,
    no_done,
    open_fake,
    rate_limited,
    status,
    stream_cut,
    stream_stall,
)

MESSAGES = [{"role": "user", "content": "Drill: say the pangram."}]


async def chat(http: httpx2.AsyncClient, url: str, **body: Any) -> httpx2.Response:
    return await http.post(f"{url}/chat/completions", json={"messages": MESSAGES, **body})


@drill("free-off")
async def free_off(workdir: Path) -> Result:
    """FREE_LANE=off: the sidecar starts, serves from local and paid, and sends nothing to the \
free fake."""
    async with (
        open_fake("free", models=("free-model",)) as free,
        open_fake("local", models=("local-model",)) as local,
        open_fake("paid", models=("paid-model",)) as paid,
    ):
        config = {
            "state": ":memory:",
            "policy": {"free_tier_fallback": "allow"},
            "lanes": [
                free_lane("free", free.base_url),
                local_lane("local", local.base_url),
                paid_lane("paid", paid.base_url),
            ],
        }
        async with (
            open_sidecar_process(config, workdir, env={**KEYS, "FREE_LANE": "off"}) as sidecar,
            httpx2.AsyncClient(trust_env=False, timeout=20) as http,
        ):
            served = []
            for n in range(10):
                if n == 5:
                    await local.refuse()
                served.append((await chat(http, sidecar.base + "/v1")).headers.get("x-lanes-lane"))
            log = sidecar.log()
    return check(
        "free-off",
        f"{len(free.log)} requests to the free fake; served {served.count('local')} local, "
        f"{served.count('paid')} paid",
        nothing_to_free=not free.log,
        served_all=served.count("local") == 5 and served.count("paid") == 5,
        one_line="free lane off (FREE_LANE=off)" in log,
    )


@drill("lane-deleted")
async def lane_deleted(workdir: Path) -> Result:
    """A copy of the package without lanes/groq.py: the sidecar starts, says so once, and serves."""
    import lanes as package

    copy = workdir / "pkg"
    shutil.copytree(
        Path(package.__file__).parent, copy / "lanes", ignore=shutil.ignore_patterns("__pycache__")
    )
    (copy / "lanes" / "groq.py").unlink()
    async with (
        open_fake("groq", models=("llama",)) as groq,
        open_fake("local", models=("local-model",)) as local,
    ):
        config = {
            "state": ":memory:",
            "lanes": [
                {
                    "name": "groq",
                    "base_url": groq.base_url,
                    "api_key_env": "FREE_API_KEY",
                    "models": [{"id": "llama"}],
                },
                local_lane("local", local.base_url),
            ],
        }
        async with (
            open_sidecar_process(config, workdir, env=KEYS, pythonpath=str(copy)) as sidecar,
            httpx2.AsyncClient(trust_env=False, timeout=20) as http,
        ):
            response = await chat(http, sidecar.base + "/v1")
            log = sidecar.log()
    lines = [line for line in log.splitlines() if "groq" in line and "not found" in line]
    return check(
        "lane-deleted",
        f"{len(lines)} log line about the deleted lane; served by "
        f"{response.headers.get('x-lanes-lane')}",
        one_line=len(lines) == 1,
        says_which="module lanes.groq not found — skipped" in log,
        serves=response.status_code == 200,
    )


@drill("provider-refused-at-start")
async def refused_at_start(workdir: Path) -> Result:
    """Every free provider refuses at startup: /health as soon as with them up, /ready through \
the others, one line each.

    "As soon as" is judged against a sidecar started at the same moment on the same lanes with
    every provider up (interpreter start and the machine's load are in both figures). The two
    share the CPU, so on a loaded machine one may be served first and the other wait out its
    start too: within twice the baseline and two seconds. Waiting on the dead providers — a
    connect timeout, a retry — would cost seconds more."""
    async with (
        open_fake("a", models=("m",)) as a,
        open_fake("b", models=("m",)) as b,
        open_fake("local", models=("local-model",)) as local,
        open_fake("a", models=("m",)) as a_up,
        open_fake("b", models=("m",)) as b_up,
        open_fake("local", models=("local-model",)) as local_up,
    ):
        await a.refuse()
        await b.refuse()
        configs = [
            {
                "state": ":memory:",
                "lanes": [
                    free_lane("a", one.base_url, ["m"]),
                    free_lane("b", two.base_url, ["m"]),
                    local_lane("local", three.base_url),
                ],
            }
            for one, two, three in ((a, b, local), (a_up, b_up, local_up))
        ]
        folders = [workdir / "refused", workdir / "up"]
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)
        async with (
            open_sidecar_processes_at_once(
                list(zip(configs, folders, strict=True)), env=KEYS
            ) as both,
            httpx2.AsyncClient(trust_env=False, timeout=20) as http,
        ):
            sidecar, baseline = both
            ready = await http.get(sidecar.base + "/ready")
            served = await chat(http, sidecar.base + "/v1")
            await trio.sleep(0.5)
            log = sidecar.log()
            alive = sidecar.process.returncode is None
    dead_lines = {
        name: len(re.findall(rf"lane {name}: provider unreachable at startup", log))
        for name in "ab"
    }
    return check(
        "provider-refused-at-start",
        f"/health in {sidecar.health_s * 1000:.0f} ms after spawn (interpreter start included; "
        f"{baseline.health_s * 1000:.0f} ms with every provider up); lines per dead provider "
        f"{dead_lines}",
        ready=ready.status_code == 200 and ready.json()["lanes"] == ["local"],
        one_line_each=dead_lines == {"a": 1, "b": 1},
        serves=served.status_code == 200,
        alive=alive,
        health_as_soon_as_with_them_up=sidecar.health_s <= 2 * baseline.health_s + 2.0,
    )


@drill("provider-hung")
async def provider_hung(workdir: Path) -> Result:
    """A provider accepts and never answers: every job still answers within its deadline plus
    0.5 s beyond the round trip of as many jobs answered at once.

    The sidecar is a process of its own, as in a deployment: the clients' work is not its. The
    round trip is measured in the same run, just before and just after, with the same number of
    concurrent jobs pinned to a provider that answers at once: on a loaded machine both grow
    alike, and the margin is what the deadline itself costs."""
    async with (
        open_fake("free", models=("free-model",)) as free,
        open_fake("local", models=("local-model",)) as local,
        open_fake("quick", models=("quick-model",)) as quick,
    ):
        free.script("free-model", hang())
        local.script("local-model", hang())
        config = {
            "state": ":memory:",
            "policy": {"free_tier_fallback": "allow"},
            "scoring": {"explore_rate": 0.0},
            "lanes": [
                {**free_lane("free", free.base_url, ["free-model"]), "attempt_timeout_s": 1.0},
                local_lane("local", local.base_url),
                # only for the round trip: pinned, and never reached by the hung jobs (the local
                # lane holds them to their deadlines)
                paid_lane("quick", quick.base_url, ["quick-model"]),
            ],
        }
        async with (
            open_sidecar_process(config, workdir, env=KEYS) as sidecar,
            httpx2.AsyncClient(trust_env=False, timeout=20) as http,
        ):
            before = await _burst(http, sidecar.base, [None] * 40, model="quick/quick-model")
            hung = await _burst(http, sidecar.base, [1500 + 25 * i for i in range(40)])
            after = await _burst(http, sidecar.base, [None] * 40, model="quick/quick-model")
    overshoots = sorted(late for late, _ in hung)
    statuses = [code for _, code in hung]
    round_trip = max(late for late, _ in before + after)
    median, worst = overshoots[len(overshoots) // 2], overshoots[-1]
    return check(
        "provider-hung",
        f"40 jobs: finish after deadline median {median * 1000:+.0f} ms, worst "
        f"{worst * 1000:+.0f} ms; 40 jobs answered at once, round trip up to "
        f"{round_trip * 1000:.0f} ms; statuses {sorted(set(statuses))}",
        within_margin=worst <= 0.5 + round_trip,
        all_answered=len(statuses) == 40,
        all_504=set(statuses) == {504},
        round_trip_served=[code for _, code in before + after] == [200] * 80,
    )


async def _burst(
    http: httpx2.AsyncClient, base: str, deadlines_ms: list[int | None], **body: Any
) -> list[tuple[float, int]]:
    """One concurrent job per deadline: how long after its deadline each answered (after it was
    sent, with no deadline) and its status."""
    answered: list[tuple[float, int]] = []

    async def one(deadline_ms: int | None) -> None:
        headers = {} if deadline_ms is None else {"X-Lanes-Deadline-Ms": str(deadline_ms)}
        start = trio.current_time()
        response = await http.post(
            f"{base}/v1/chat/completions", json={"messages": MESSAGES, **body}, headers=headers
        )
        answered.append(
            (trio.current_time() - start - (deadline_ms or 0) / 1000, response.status_code)
        )

    async with trio.open_nursery() as nursery:
        for deadline_ms in deadlines_ms:
            nursery.start_soon(one, deadline_ms)
    return answered


@drill("provider-reboot")
async def provider_reboot(workdir: Path) -> Result:
    """A provider goes down mid-traffic and comes back: others serve meanwhile; traffic returns."""
    breaker = {"failures": 2, "cooldown_s": 0.5, "jitter": 0}
    async with open_sidecar(
        ("local", "local", ["local-model"], {"breaker": breaker}), ("paid", "paid", ["paid-model"])
    ) as (url, fakes):
        lanes_seen: list[str] = []
        async with httpx2.AsyncClient(trust_env=False, timeout=20) as http:
            for phase, count in (("up", 5), ("down", 10), ("back", 10)):
                if phase == "down":
                    await fakes["local"].refuse()
                if phase == "back":
                    await fakes["local"].listen()
                    await trio.sleep(0.6)
                for _ in range(count):
                    response = await chat(http, url)
                    lanes_seen.append(
                        f"{phase}:{response.headers.get('x-lanes-lane')}:{response.status_code}"
                    )
                    await trio.sleep(0.05)
    down = [s for s in lanes_seen if s.startswith("down")]
    back = [s for s in lanes_seen if s.startswith("back")]
    return check(
        "provider-reboot",
        f"outage: {sum(':paid:200' in s for s in down)}/10 served by paid; after: "
        f"{sum(':local:200' in s for s in back)}/10 back on local",
        served_meanwhile=all(":200" in s for s in down),
        returned=sum(":local:200" in s for s in back) >= 8,
    )


@drill("rate-limit-storm")
async def rate_limit_storm(workdir: Path) -> Result:
    """200 concurrent clients, a free provider answering 429 + Retry-After: one attempt per \
window."""
    async with open_sidecar(
        ("free", "free", ["free-model"]),
        ("paid", "paid", ["paid-model"]),
        policy={"free_tier_fallback": "off"},
        # the 200 clients share the sidecar's process: on a loaded machine the last may wait their
        # turn past the 10 s a request's headers are given by default, and be shed as slow-loris
        server={"idle_timeout_s": 60.0},
    ) as (url, fakes):
        fakes["free"].script("free-model", rate_limited(retry_after=5))
        statuses, retry_afters = [], set()
        async with httpx2.AsyncClient(
            trust_env=False, timeout=30, limits=httpx2.Limits(max_connections=250)
        ) as http:

            async def one() -> None:
                response = await chat(http, url)
                statuses.append(response.status_code)
                retry_afters.add(response.headers.get("retry-after"))

            async with trio.open_nursery() as nursery:
                for _ in range(200):
                    nursery.start_soon(one)
        times = [r.at for r in fakes["free"].log]
    in_window = sum(1 for t in times if t < times[0] + 5.0)
    exact = all(a is not None and 1 <= int(a) <= 6 for a in retry_afters)
    return check(
        "rate-limit-storm",
        f"{in_window} upstream attempt(s) in the 5 s window for 200 clients "
        f"({len(times)} in all); Retry-After {sorted(map(str, retry_afters))}",
        one_attempt=in_window == 1,
        all_429=set(statuses) == {429},
        exact=exact,
        nothing_paid=not fakes["paid"].log,
    )


@drill("credits-gone")
async def credits_gone(workdir: Path) -> Result:
    """A credit-based provider answers 402: the long backoff holds, no retry storm, the ceiling \
holds."""
    credit = {
        "free_tier": {"kind": "credits", "budget_usd": 5},
        # priced: a credit attempt is held to its worst case, and an unknown price has none
        "models": [{"id": "credit-model", "input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0}],
    }
    ceiling = 0.0002
    async with open_sidecar(
        ("credit", "free", ["credit-model"], credit),
        ("paid", "paid", ["paid-model"]),
        policy={"free_tier_fallback": "allow", "paid_ceiling_usd_per_day": ceiling},
    ) as (url, fakes):
        fakes["credit"].script(
            "credit-model", status(402, {"error": {"message": "Insufficient credits"}})
        )
        statuses = []
        async with httpx2.AsyncClient(trust_env=False, timeout=20) as http:
            started = trio.current_time()
            for _ in range(30):
                statuses.append((await chat(http, url, max_tokens=20)).status_code)
            lanes_state = (await http.get(f"{url}/lanes")).json()
            elapsed = trio.current_time() - started  # the backoff (5 min and up) has run this long
    backoff = next(
        m["backoff_s"]
        for lane in lanes_state["lanes"]
        if lane["name"] == "credit"
        for m in lane["models"]
    )
    spent = lanes_state["paid"]["spent_today_usd"]
    return check(
        "credits-gone",
        f"{len(fakes['credit'].log)} request(s) to the 402 provider for 30 jobs; backoff "
        f"{backoff:.0f} s; paid ${spent:.6f} of ${ceiling}; {statuses.count(200)} served, "
        f"{statuses.count(429)} refused at the ceiling",
        no_storm=len(fakes["credit"].log) == 1,
        long_backoff=backoff >= 300 - elapsed,
        ceiling_holds=spent <= ceiling + 1e-12,
        refused_beyond=statuses.count(429) > 0,
    )


@drill("quality-drift")
async def quality_drift(workdir: Path) -> Result:
    """A fake silently changes its answers: the canary flags it and routing skips it."""
    import lanes
    from lanes.canary.prompts import CanaryConfig, Checks, Prompt
    from lanes.canary.run import pin, report, run_canary

    prompts = CanaryConfig(
        prompts=[
            Prompt(
                id=f"p{i}",
                messages=[{"role": "user", "content": f"pangram {i}"}],
                checks=Checks(contains=["quick brown fox"]),
            )
            for i in range(10)
        ]
    )
    async with (
        open_fake("free", models=("m",)) as free,
        open_fake("paid", models=("paid-model",)) as paid,
    ):
        config = lanes.load_config(
            {
                "state": str(workdir / "drift.db"),
                "policy": {"free_tier_fallback": "allow"},
                "lanes": [
                    free_lane("free", free.base_url, ["m"]),
                    paid_lane("paid", paid.base_url),
                ],
            },
            env={},
        )
        async with lanes.open_dispatcher(config, env=KEYS) as d:
            await run_canary(d, prompts)
            pin(d.store)
        free.script("m", answer(text="Certainly! A quick brown fox, they say, once jumped a dog."))
        async with lanes.open_dispatcher(config, env=KEYS) as d:
            await run_canary(d, prompts)
            verdict = {r.key: r.verdict for r in report(d.store, prompts)}
        async with lanes.open_dispatcher(config, env=KEYS) as d:
            before = len(free.log)
            reply = await d.complete(lanes.Job(messages=MESSAGES, model="auto"))
            skipped = next((s.reason for s in reply.skips if s.lane == "free"), "")
            sent = len(free.log) - before
    return check(
        "quality-drift",
        f"verdict {verdict.get('free/m')}; next job served by {reply.lane}, {sent} sent to it",
        flagged=verdict.get("free/m") == "drifted",
        skipped="quarantined by the canary" in skipped,
        nothing_sent=sent == 0,
    )


@drill("crash")
async def crash(workdir: Path) -> Result:
    """SIGKILL the sidecar mid-traffic and restart it: counts and paid spend intact, service \
resumes."""
    async with (
        open_fake("free", models=("free-model",)) as free,
        open_fake("paid", models=("paid-model",)) as paid,
    ):
        paid.script("paid-model", answer(delay_s=0.3))
        config = {
            "state": str(workdir / "crash.db"),
            "policy": {"free_tier_fallback": "allow", "paid_ceiling_usd_per_day": 1.0},
            "lanes": [
                free_lane("free", free.base_url, free_tier={"kind": "rate_limited", "rpd": 8}),
                paid_lane("paid", paid.base_url),
            ],
        }
        async with httpx2.AsyncClient(trust_env=False, timeout=20) as http:
            async with open_sidecar_process(config, workdir, env=KEYS) as first:
                for _ in range(6):
                    await chat(http, first.base + "/v1")
                await trio.sleep(0.7)  # a sync interval: the counts reach the file
                # paid jobs in flight when the process dies
                async with trio.open_nursery() as nursery:
                    for _ in range(4):
                        nursery.start_soon(
                            _ignore_errors,
                            chat(http, first.base + "/v1", model="paid/paid-model", max_tokens=50),
                        )
                    with trio.fail_after(10):  # all four reserved and sent: now they are in flight
                        while len(paid.requests()) < 4:  # noqa: ASYNC110 - the fake logs, no event
                            await trio.sleep(0.01)
                    first.process.send_signal(signal.SIGKILL)
                await first.process.wait()
            in_flight_reserved = (
                4 * (len(json.dumps([MESSAGES, None]).encode()) * 1.0 + 50 * 2.0) / 1e6
            )
            async with open_sidecar_process(config, workdir, env=KEYS) as second:
                state = (await http.get(second.base + "/v1/lanes")).json()
                more = [
                    (await chat(http, second.base + "/v1")).headers.get("x-lanes-lane")
                    for _ in range(3)
                ]
    used = next(
        m["used_today"] for lane in state["lanes"] if lane["name"] == "free" for m in lane["models"]
    )
    spent = state["paid"]["spent_today_usd"]
    return check(
        "crash",
        f"after SIGKILL: free used_today {used}/6 kept, paid ledger ${spent:.6f} "
        f"(≥ ${in_flight_reserved:.6f} reserved in flight); then served {more}",
        counts_kept=used >= 6,
        spend_not_undercounted=spent >= in_flight_reserved - 1e-12,
        resumes=more[:2] == ["free", "free"] and more[2] == "paid",
    )


@drill("shared-state-lost")
async def shared_state_lost(workdir: Path) -> Result:
    """Two sidecars on one Redis; Redis is SIGKILLed mid-traffic and restarted empty. Both keep
    serving, paid stays closed while the ledger is away, each logs one line, and the ledger is
    pushed back."""
    if (skipped := without_redis("shared-state-lost")) is not None:
        return skipped
    server = RedisServer(workdir / "redis").start()
    paid_job = {"model": "paid/paid-model", "max_tokens": 20}
    try:
        async with (
            open_fake("local", models=("local-model",)) as local,
            open_fake("paid", models=("paid-model",)) as paid,
        ):
            config = {
                "state": server.url,
                "scoring": {"explore_rate": 0.0},
                "policy": {"free_tier_fallback": "allow", "paid_ceiling_usd_per_day": 1.0},
                "lanes": [local_lane("local", local.base_url), paid_lane("paid", paid.base_url)],
            }
            async with (
                open_sidecar_processes(config, workdir, env=KEYS) as sidecars,
                httpx2.AsyncClient(trust_env=False, timeout=20) as http,
            ):
                urls = [s.base + "/v1" for s in sidecars]
                before = [(await chat(http, u, **paid_job)).status_code for u in urls]
                statuses: list[int] = []
                stop = trio.Event()

                async def traffic() -> None:
                    i = 0
                    while not stop.is_set():
                        statuses.append((await chat(http, urls[i % 2])).status_code)
                        i += 1
                        await trio.sleep(0.02)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(traffic)
                    await trio.sleep(0.3)
                    server.kill()
                    await trio.sleep(1.5)  # both notice at their next sync
                    during = [
                        (await chat(http, u, **paid_job)).json().get("error", {}).get("code")
                        for u in urls
                    ]
                    paid_before_restart = len(paid.log)
                    server.start()  # no persistence: an empty Redis
                    back_at = time.monotonic()  # wall-clock: recovery is measured in real time
                    reopened_s = []
                    with trio.move_on_after(15):
                        for u in urls:
                            while (await chat(http, u, **paid_job)).status_code != 200:  # noqa: ASYNC110 - an HTTP poll, no event to wait on
                                await trio.sleep(0.05)
                            reopened_s.append(time.monotonic() - back_at)  # wall-clock: as above
                    stop.set()
                logs = [s.log() for s in sidecars]
            ledger = redis.Redis.from_url(server.url, decode_responses=True)
            entries = sum(ledger.hlen(key) for key in ledger.keys("lanes:paid:*"))
    finally:
        server.stop()
    outage_lines = [
        len(re.findall(r"state store: redis at .*serving on this host's view", log)) for log in logs
    ]
    return check(
        "shared-state-lost",
        f"Redis down ~1.5 s: {statuses.count(200)}/{len(statuses)} local jobs served; paid refused "
        f"{during.count('paid_budget_exhausted')}/2 meanwhile, 0 sent; reopened "
        f"{', '.join(f'{t:.2f}' for t in reopened_s)} s after Redis returned; "
        f"{entries} ledger entries (2 pushed back); outage log lines {outage_lines}",
        before=before == [200, 200],
        kept_serving=bool(statuses) and set(statuses) == {200},
        paid_closed=during == ["paid_budget_exhausted"] * 2 and paid_before_restart == 2,
        reopened=len(reopened_s) == 2,
        ledger_pushed_back=entries == 4,
        one_line=outage_lines == [1, 1],
    )


async def _ignore_errors(call: Awaitable[Any]) -> None:
    with contextlib.suppress(httpx2.HTTPError):
        await call


@drill("stream-faults")
async def stream_faults(workdir: Path) -> Result:
    """Cut, stalled, malformed and unterminated streams: never a truncated answer presented as \
success."""
    fast = {"first_token_s": 1.0, "idle_s": 0.5, "breaker": {"failures": 100}}
    other = answer(text="Something else entirely, said differently.")
    cases = {  # (the first lane's fault, what the fallback answers, the honest outcome)
        "cut/recovered": (stream_cut(after=3), answer(), "whole"),
        "cut/unrecoverable": (stream_cut(after=3), other, "error-event"),
        "cut-clean/unrecoverable": (stream_cut(after=3, clean=True), other, "error-event"),
        "stalled/recovered": (stream_stall(after=2), answer(), "whole"),
        "stalled/unrecoverable": (stream_stall(after=2), other, "error-event"),
        "malformed": (malformed_chunk(after=2), other, "whole"),
        "no-done": (no_done(), other, "whole"),
    }
    outcomes: dict[str, str] = {}
    async with (
        open_sidecar(
            ("local", "local", ["local-model"], fast), ("paid", "paid", ["paid-model"])
        ) as (url, fakes),
        httpx2.AsyncClient(trust_env=False, timeout=20) as http,
    ):
        for name, (fault, fallback, _) in cases.items():
            fakes["local"].script("local-model", fault)
            fakes["paid"].script("paid-model", fallback)
            outcomes[name] = await _stream_outcome(http, url)
    lies = [n for n, o in outcomes.items() if o == "truncated-done"]
    wrong = [n for n, (_, _, expected) in cases.items() if outcomes[n] != expected]
    return check(
        "stream-faults",
        f"{len(outcomes)} faulty streams, {len(lies)} truncated answers ended as success: "
        + ", ".join(f"{k}={v}" for k, v in outcomes.items()),
        no_lies=not lies,
        as_expected=not wrong,
    )


async def _stream_outcome(http: httpx2.AsyncClient, url: str) -> str:
    text, done, error = "", False, False
    async with http.stream(
        "POST", f"{url}/chat/completions", json={"messages": MESSAGES, "stream": True}
    ) as response:
        async for line in response.aiter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                payload = json.loads(line[6:])
                error = error or "error" in payload
                for choice in payload.get("choices", []):
                    text += (choice.get("delta") or {}).get("content") or ""
    if done and text == ANSWER:
        return "whole"
    if done:
        return "truncated-done"
    return "error-event" if error else "cut-without-error"


async def run(names: list[str], workdir: Path) -> list[Result]:
    """Run the named drills one after another, each in its own directory; a crash is a failure."""
    results = []
    for name in names:
        start = time.monotonic()  # wall-clock: a drill reports how long it took
        folder = workdir / name
        folder.mkdir(parents=True, exist_ok=True)
        try:
            with trio.fail_after(120):
                result = await DRILLS[name](folder)
        except Exception as exc:  # a drill that blows up is a failed drill, not a crashed runner
            result = Result(
                name=name, ok=False, figure="crashed", detail=f"{type(exc).__name__}: {exc}"[:300]
            )
        elapsed = time.monotonic() - start  # wall-clock: as above
        results.append(attrs.evolve(result, detail=(result.detail + f" ({elapsed:.1f}s)").strip()))
    return results


# Drills kept in modules of their own register themselves on import (after the ones above, so
# `lanes drill all` runs them last).
from lanes.drills import (  # noqa: E402, F401
    batch_crash,
    clock,
    conns,
    hostile,
    redis_evict,
    redis_failover,
    workers,
)

__all__ = ["DRILLS", "Drill", "Result", "check", "drill", "run"]

"""The hostile-upstream drill: the worst answers an upstream can give, through a real `lanes serve`.

A gigabyte JSON body, a gzip bomb, a gigabyte error body, a stream whose one event never ends,
NaN, nesting 100,000 deep, usage of 2^64 tokens, Retry-After of 1e308 and 1e20: each job must be
answered (by the healthy lane behind) within its deadline plus a second, the process must stay up
with its peak memory under 300 MB, log no traceback, keep its background tasks well, and keep a
paid ledger no smaller than what was billed.
"""

from __future__ import annotations

import functools
import itertools
import time
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path

import httpx2

from lanes.drills.registry import Result, check, drill
from lanes.harness.configs import KEYS, paid_lane
from lanes.harness.processes import open_sidecar_process
from lanes.testing import Behaviour, answer, open_fake, raw

MiB = 1024 * 1024
DEADLINE_MS = 5000
SSE = {"content-type": "text/event-stream"}
GOOD_USAGE = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}


def _repeat(
    piece: bytes, times: int, head: bytes = b"", tail: bytes = b""
) -> Callable[[], Iterable[bytes]]:
    return lambda: itertools.chain([head], itertools.repeat(piece, times), [tail])


@functools.cache
def gzip_bomb(size: int) -> bytes:
    """`size` zero bytes, gzip-compressed (about a thousandth of that on the wire). Made once per
    process: 256 MiB is two seconds of compressing."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = b"\0" * MiB
    return b"".join([*(compressor.compress(block) for _ in range(size // MiB)), compressor.flush()])


def _completion(text: str) -> str:
    return (
        '{"id": "x", "object": "chat.completion", "model": "m", "choices": [{"index": 0, '
        f'"message": {{"role": "assistant", "content": "{text}"}}, "finish_reason": "stop"}}]'
    )


def cases(bomb_size: int = 256 * MiB) -> dict[str, tuple[Behaviour, bool]]:
    """Case → (what the hostile upstream answers, whether the job streams)."""
    piece = b"x" * (64 * 1024)
    return {
        "1 GiB JSON body": (
            raw(chunks=_repeat(piece, 16384, b'{"choices": [{"message": {"content": "', b'"}}]}')),
            False,
        ),
        f"gzip bomb ({bomb_size // MiB} MiB of zeros)": (
            raw(body=gzip_bomb(bomb_size), headers={"content-encoding": "gzip"}),
            False,
        ),
        "1 GiB error body": (raw(500, chunks=_repeat(piece, 16384)), False),
        "1 GiB stream event": (
            raw(headers=SSE, chunks=_repeat(piece, 16384, b"data: ")),
            True,
        ),
        "NaN": (raw(body=(_completion("x")[:-1] + ', "n": NaN}').encode()), False),
        "nested 100,000 deep": (raw(body=b"[" * 100_000 + b"]" * 100_000), False),
        "usage 2^64": (answer(usage={"prompt_tokens": 2**64, "completion_tokens": 2**64}), False),
        "Retry-After 1e308": (raw(429, b"{}", headers={"retry-after": "1e308"}), False),
        "Retry-After 1e20": (raw(429, b"{}", headers={"retry-after": "1e20"}), False),
    }


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident memory so far (VmHWM), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


@drill("hostile-upstream")
async def hostile_upstream(workdir: Path) -> Result:
    """The worst upstream answers (1 GiB bodies, a gzip bomb, NaN, deep nesting, 2^64 tokens, \
Retry-After 1e308): every job answered by its deadline + 1 s, peak RSS < 300 MB, nothing dies."""
    scripted = cases()
    async with open_fake("sick") as sick, open_fake("good") as good:
        good.script("good-model", answer(usage=GOOD_USAGE))
        models = [f"hostile-{i}" for i in range(len(scripted))]
        for model, (behaviour, _) in zip(models, scripted.values(), strict=True):
            sick.script(model, behaviour)
        config = {
            "state": str(workdir / "state.db"),
            "scoring": {"explore_rate": 0.0},
            "aliases": {m: [f"sick/{m}", "good/good-model"] for m in models},
            "policy": {
                "free_tier_fallback": "allow",
                "paid_attempts": 2,
                "transient_retries": 0,
                "max_wait_s": 0,
                "paid_ceiling_usd_per_day": 100.0,
            },
            "lanes": [
                paid_lane("sick", sick.base_url, models),
                paid_lane("good", good.base_url, ["good-model"]),
            ],
        }
        async with (
            open_sidecar_process(config, workdir, env=KEYS) as sidecar,
            httpx2.AsyncClient(trust_env=False, timeout=30) as http,
        ):
            baseline = peak_rss_mb(sidecar.process.pid)
            took: dict[str, float] = {}
            served: dict[str, bool] = {}
            refused: dict[str, str] = {}
            for model, (case, (_, stream)) in zip(models, scripted.items(), strict=True):
                start = time.monotonic()  # wall-clock: the drill measures real answer times
                response = await http.post(
                    f"{sidecar.base}/v1/chat/completions",
                    json={
                        "model": model,
                        "stream": stream,
                        "max_tokens": 20,
                        "messages": [{"role": "user", "content": "Drill: say the pangram."}],
                    },
                    headers={"x-lanes-deadline-ms": str(DEADLINE_MS)},
                )
                took[case] = time.monotonic() - start  # wall-clock: as above
                served[case] = response.status_code == 200
                if not served[case]:  # said with the result: what the client got instead
                    refused.setdefault(case, f"{response.status_code} {response.text[:200]}")
            ready = (await http.get(f"{sidecar.base}/ready")).json()
            lanes_state = (await http.get(f"{sidecar.base}/v1/lanes")).json()
            peak = peak_rss_mb(sidecar.process.pid)
            alive = sidecar.process.returncode is None
        log = sidecar.log()
    slowest = max(took, key=took.__getitem__)
    billed = len(good.requests("good-model")) * (10 * 1.0 + 5 * 2.0) / 1e6
    spent = lanes_state["paid"]["spent_today_usd"]
    return check(
        "hostile-upstream",
        f"{sum(served.values())}/{len(served)} answered; slowest "
        f"{took[slowest]:.2f} s ({slowest}); peak RSS {peak:.0f} MB (from {baseline:.0f} MB)"
        + "".join(f"; {case}: {why}" for case, why in list(refused.items())[:2]),
        all_served=all(served.values()),
        within_deadline=max(took.values()) <= DEADLINE_MS / 1000 + 1.0,
        memory=peak < 300,
        alive=alive,
        tasks_well=ready.get("failing") == {},
        ledger=spent >= billed - 1e-12,
        no_traceback="Traceback" not in log,
    )

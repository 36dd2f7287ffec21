"""The drill of `lanes serve --workers N` in the ordinary life of a host: a config edited on disk
without a reload, workers killed as the OOM killer would, a file left mid-edit — and then a reload
that is a decision."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import httpx2

from lanes.drills.registry import Result, check, drill
from lanes.harness.configs import KEYS, paid_lane
from lanes.harness.processes import SidecarProcess, open_sidecar_process
from lanes.testing import open_fake

CHAT = {"model": "auto", "messages": [{"role": "user", "content": "Drill: say the pangram."}]}


def _config(paid_url: str, fallback: str, ceiling: float) -> dict[str, Any]:
    return {
        "policy": {"free_tier_fallback": fallback, "paid_ceiling_usd_per_day": ceiling},
        "lanes": [paid_lane("paid", paid_url)],
    }


def _runs(views: dict[int, Any]) -> set[tuple[str, str, float]]:
    """What the workers' configs say, as (hash, consent, ceiling): one element when they agree.
    (The terms in force are the store's — the strictest any live process announced — so a
    SIGKILLed worker's announcement holds them until it lapses; the config is what this drill is
    about.)"""
    return {
        (
            v["config"]["sha256"],
            v["paid"]["configured"]["consent"],
            v["paid"]["configured"]["ceiling_usd"],
        )
        for v in views.values()
    }


async def _kill(sidecar: SidecarProcess, number: int) -> None:
    """SIGKILL worker `number`, and wait until its successor serves."""
    host = await sidecar.host()
    pid = next(w["pid"] for w in host["workers"] if w["worker"] == number)
    os.kill(pid, signal.SIGKILL)
    await sidecar.until_host(
        lambda h: (
            all(w["serving"] for w in h["workers"]) and pid not in {w["pid"] for w in h["workers"]}
        )
    )


@drill("worker-restart")
async def worker_restart(workdir: Path) -> Result:
    """--workers 2: the file edited on disk and a worker SIGKILLed runs the running config; a \
broken file never stops the host; SIGHUP refuses the new one (it lowers the guard), SIGUSR1 \
(`reload --accept-weaker`) starts every worker on it."""
    async with open_fake("paid", models=("paid-model",)) as paid:
        old, new = _config(paid.base_url, "off", 0.002), _config(paid.base_url, "allow", 5.0)
        args = ("--workers", "2")
        async with (
            open_sidecar_process(old, workdir, env=KEYS, args=args) as sidecar,
            httpx2.AsyncClient(trust_env=False, timeout=20) as http,
        ):
            await sidecar.until_host(lambda h: all(w["serving"] for w in h["workers"]))
            started = _runs(await sidecar.every_worker(2))
            sidecar.rewrite(new)  # fallback off → allow, the ceiling raised: no reload
            await _kill(sidecar, 1)
            edited = _runs(await sidecar.every_worker(2))
            refused = [(await http.post(f"{sidecar.base}/v1/chat/completions", json=CHAT))
                       .status_code for _ in range(4)]  # fmt: skip
            sidecar.rewrite("[policy\nfree_tier_fallback = ")  # the file mid-edit
            await _kill(sidecar, 2)
            broken = _runs(await sidecar.every_worker(2))
            sidecar.process.send_signal(signal.SIGHUP)  # reload the broken file: refused
            await sidecar.until_host(lambda h: h["reloads"] == 1)
            sidecar.rewrite(new)
            sidecar.process.send_signal(signal.SIGHUP)  # it raises the ceiling: refused
            weaker = (await sidecar.until_host(lambda h: h["reloads"] == 2))["last_reload"]
            sidecar.process.send_signal(signal.SIGUSR1)  # confirmed
            host = await sidecar.until_host(lambda h: h["reloads"] == 3)
            reloaded = _runs(await sidecar.every_worker(2))
            alive = sidecar.process.returncode is None
            log = sidecar.log()
    [(first, *_)] = started if len(started) == 1 else [("", "", 0.0)]
    lines = [line for line in log.splitlines() if "config reloaded:" in line]
    return check(
        "worker-restart",
        f"edited + SIGKILL: {len(edited)} config(s) {sorted(edited)[0][0][:12]} "
        f"({sorted(edited)[0][1]}, ${sorted(edited)[0][2]}), {len(paid.requests())} paid requests; "
        f"broken file + SIGKILL: {len(broken)} config(s), parent {'up' if alive else 'GONE'}; "
        f"SIGHUP {'refused' if not weaker['ok'] else 'ACCEPTED'} (it lowers the guard); "
        f"SIGUSR1: {len(reloaded)} config(s) {sorted(reloaded)[0][0][:12]} "
        f"({sorted(reloaded)[0][1]}, ${sorted(reloaded)[0][2]})",
        running_config_stays=edited == started == {(first, "off", 0.002)},
        nothing_paid=not paid.requests() and 200 not in refused,
        broken_file_keeps_serving=broken == started and alive,
        broken_reload_refused="reload refused: " in log and "not valid TOML" in log,
        weaker_reload_refused=not weaker["ok"] and "lower the guard" in weaker["message"],
        reload_reaches_every_worker=len(reloaded) == 1
        and next(iter(reloaded))[1:] == ("allow", 5.0)
        and next(iter(reloaded))[0] == host["sha256"] != first,
        one_line=len(lines) == 1
        and "policy.free_tier_fallback, policy.paid_ceiling_usd_per_day" in lines[0],
    )

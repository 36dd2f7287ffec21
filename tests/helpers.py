"""Builders for configs that point at fake providers, and the `lanes` command run in process."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx2
import trio

from lanes import Config, Dispatcher, load_config
from lanes._core.state.store import SQLiteStore
from lanes.harness.configs import FREE_KEY, PAID_KEY, free_lane, lane, local_lane, paid_lane

__all__ = [
    "ENGINE_POLICY",
    "NO_EXPLORATION",
    "FREE_KEY",
    "PAID_KEY",
    "PREFILL_PAIR",
    "QUICK",
    "audit_of",
    "config",
    "examples",
    "free_lane",
    "http_client",
    "lane",
    "lanes_command",
    "local_lane",
    "paid_lane",
    "spent",
    "sqlite_store",
    "store_up",
]


#: `make test-quick`: properties are searched a fifth as deeply (see `examples`).
QUICK = os.environ.get("LANES_TEST_QUICK", "") == "1"


def examples(n: int) -> int:
    """How many examples a property searches: `n` in the whole suite, a fifth of it (at least 10)
    in `make test-quick`."""
    return max(10, n // 5) if QUICK else n


# The engine's tests exercise fallback itself, so they allow paid fallback under a roomy ceiling;
# the policy's tests set `policy` explicitly.
ENGINE_POLICY = {"free_tier_fallback": "allow", "paid_ceiling_usd_per_day": 100.0}
# Exploration is random by design; tests that are not about it switch it off to stay deterministic.
NO_EXPLORATION = {"explore_rate": 0.0}
# Two paid models a cut stream can be resumed on (prefill), at the paid fakes' prices (USD per
# million tokens, lanes.harness.configs).
PREFILL_PAIR = {
    "models": [
        {"id": m, "input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0, "prefill": True}
        for m in ("p1", "p2")
    ]
}


def config(*lanes: dict[str, Any], **top: Any) -> Config:
    top.setdefault("policy", ENGINE_POLICY)
    top.setdefault("scoring", NO_EXPLORATION)
    return load_config({"lanes": list(lanes), **top}, env={})


def sqlite_store(dispatcher: Dispatcher) -> SQLiteStore:
    """The dispatcher's store, for a test whose config keeps state in SQLite and reads its tables
    through `records` (raw SQL over its file, which no protocol offers)."""
    store = dispatcher.store
    assert isinstance(store, SQLiteStore), f"this test expects SQLite state, not {store.kind}"
    return store


async def store_up(dispatcher: Dispatcher, within_s: float = 10.0) -> None:
    """Wait until the dispatcher's state store is up (a first sync, or a reopening, done)."""
    with trio.fail_after(within_s):
        while not dispatcher.store.up:  # noqa: ASYNC110 - the sync sets no event to wait on
            await trio.sleep(0.02)


def http_client(**kw: Any) -> httpx2.AsyncClient:
    """A plain HTTP client for a sidecar on loopback: no proxy from the environment, 30 s."""
    return httpx2.AsyncClient(trust_env=False, timeout=30, **kw)


async def spent(http: httpx2.AsyncClient, url: str, headers: Mapping[str, str] = {}) -> float:
    """Today's paid spend as the ledger has it (reservations and settlements)."""
    state = (await http.get(f"{url}/lanes", headers=dict(headers))).json()
    return float(state["paid"]["spent_today_usd"])


def lanes_command(*argv: str) -> subprocess.CompletedProcess[str]:
    """`lanes ARGV` run by the command's own `main` in this process, reported as `subprocess.run`
    reports a child (exit code, stdout, stderr). For the commands whose point is what they print,
    write and return rather than the process: a child costs an interpreter and a second of
    importing `lanes` (tests/test_cli.py runs `python -m lanes` itself). Not under trio: `main`
    runs its own."""
    from lanes._cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exit_:  # argparse's bad usage: exit 2, its one line said
            code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    return subprocess.CompletedProcess(["lanes", *argv], code, out.getvalue(), err.getvalue())


def audit_of(path: Path, jobs: list[str], *, start: float, step: float = 60.0) -> Path:
    """An audit file of one job every `step` seconds from `start` on ollama's llama3.2:3b, written
    as a sidecar writes it (rows, attempts, hourly roll-ups): "ok" served; "refused" failed after
    ollama refused its connection (an attempt recorded); "skipped" failed with no attempt (the
    breaker was open: the job never reached ollama)."""
    import sqlite3

    from lanes._core.state.audit_tables import SCHEMA, write

    model = "llama3.2:3b"
    rows = []
    for n, how in enumerate(jobs):
        ok = how == "ok"
        common = {"job": f"job-{n}", "at": start + step * (n + 1), "client": "anonymous",
                  "cohort": "", "class": "general"}  # fmt: skip
        attempt = {**common, "n": 0, "lane": "ollama", "model": model, "tier": "local",
                   "route": "local", "outcome": "ok" if ok else "fault",
                   "category": "" if ok else "connect", "status": None, "retry": 0,
                   "latency_s": 0.5, "tokens": 25, "cost_usd": 0.0,
                   "work": "interactive"}  # fmt: skip
        rows.append(
            {
                **common,
                "route": "local" if ok else "",
                "lane": "ollama" if ok else "",
                "outcome": "ok" if ok else "no_lane_available",
                "model": model if ok else "",
                "tier": "local" if ok else "",
                "latency_s": 0.5,
                "cost_usd": 0.0,
                "approval": "",
                "asked": "auto",
                "embedding": 0,
                "streamed": 0,
                "prompt_tokens": 20,
                "completion_tokens": 5,
                "tokens": 25,
                "deadline_s": 20.0,
                "privacy": "any",
                "attempts": 0 if how == "skipped" else 1,
                "free_attempts": 0,
                "plan": json.dumps([f"ollama/{model}"]),
                "work": "interactive",
                "request_sha256": "0" * 64,
                "request_bytes": 80,
                "answer_sha256": "",
                "answer_bytes": 0,
                "attempt_log": "[]",
                "skip_log": "[]",
                "dropped": "[]",
                "explored": 0,
                "body": "",
                "zdr": 0,
                "first_free_outcome": "",
                "attempt_rows": [] if how == "skipped" else [attempt],
            }  # fmt: skip
        )
    conn = sqlite3.connect(path)
    conn.executescript(SCHEMA)
    with conn:
        write(conn, rows)
    conn.close()
    return path

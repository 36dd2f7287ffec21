"""`lanes serve` as a real process: fast startup with dead providers, graceful SIGTERM."""

from __future__ import annotations

import contextlib
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx2
import pytest
import trio

from lanes.harness.processes import free_port, open_sidecar_process, stop
from lanes.testing import answer, open_fake

pytestmark = pytest.mark.slow  # real `lanes serve` processes


async def test_startup_with_dead_providers_and_graceful_shutdown(tmp_path):
    """Every hosted provider refuses: /health answers fast, one line per dead provider; SIGTERM
    lets the in-flight job finish and the process exits 0."""
    dead = free_port()
    async with open_fake("local", models=("local-model",)) as local:
        local.script("local-model", answer(delay_s=1.0))
        config = {
            "state": ":memory:",
            "policy": {"free_tier_fallback": "allow"},
            "lanes": [
                {
                    "name": "free",
                    "module": "openai_compatible",
                    "base_url": f"http://127.0.0.1:{dead}/v1",
                    "free_tier": {"kind": "rate_limited"},
                    "models": [{"id": "f"}],
                },
                {
                    "name": "local",
                    "module": "ollama",
                    "base_url": local.base_url,
                    "models": [{"id": "local-model"}],
                },
            ],
        }
        async with open_sidecar_process(config, tmp_path) as sidecar:
            startup = sidecar.health_s
            box = {}

            async def in_flight() -> None:
                async with httpx2.AsyncClient(trust_env=False, timeout=10) as http:
                    box["r"] = await http.post(
                        f"{sidecar.base}/v1/chat/completions",
                        json={"messages": [{"role": "user", "content": "hi"}]},
                    )

            async with trio.open_nursery() as nursery:
                nursery.start_soon(in_flight)
                await trio.sleep(0.3)  # the job is now waiting on the slow local model
                sidecar.process.send_signal(signal.SIGTERM)
            code = await sidecar.process.wait()
        log = sidecar.log()
    assert box["r"].status_code == 200 and box["r"].headers["x-lanes-lane"] == "local"
    assert code == 0
    assert len(re.findall(r"lane free: provider unreachable at startup", log)) == 1, log
    assert "shutting down" in log and "lanes: lanes:" not in log  # one prefix per line
    # it answered /health (open_sidecar_process waits for that) despite the dead provider; how
    # fast is the bench's to measure, not a test's (a loaded machine is no failure)
    assert startup is not None


async def test_log_level_info_shows_one_line_per_job_with_its_id(tmp_path):
    """`lanes serve` logs at WARNING; `--log-level info` adds the one `lanes.jobs` line per job
    (its id, never a body) that `log_jobs` promises."""
    async with open_fake("local", models=("local-model",)) as local:
        config = {
            "state": ":memory:",
            "lanes": [
                {
                    "name": "local",
                    "module": "ollama",
                    "base_url": local.base_url,
                    "models": [{"id": "local-model"}],
                }
            ],
        }
        logs = {}
        for level in ("warning", "info"):
            folder = tmp_path / level
            folder.mkdir()
            async with (
                open_sidecar_process(config, folder, args=["--log-level", level]) as sidecar,
                httpx2.AsyncClient(trust_env=False, timeout=10) as http,
            ):
                reply = await http.post(
                    f"{sidecar.base}/v1/chat/completions",
                    json={"messages": [{"role": "user", "content": "a secret prompt"}]},
                )
                request_id = reply.headers["x-lanes-request-id"]
                await stop(sidecar.process)
            logs[level] = (request_id, sidecar.log())
    quiet_id, quiet = logs["warning"]
    loud_id, loud = logs["info"]
    assert f"job {quiet_id}" not in quiet
    assert f"job {loud_id}" in loud and "outcome=ok" in loud
    assert "a secret prompt" not in loud


def test_a_dedicated_process_freezes_startup_and_collects_young_garbage_less_often():
    """`dedicate_gc` (what `lanes serve` runs once started) freezes what startup built and raises
    the young generation's threshold, keeping the others; run in a process of its own, as it is."""
    probe = (
        "import gc; from lanes._http.server import YOUNG_THRESHOLD, dedicate_gc; "
        "before = gc.get_threshold(); dedicate_gc(); after = gc.get_threshold(); "
        "print(gc.get_freeze_count() > 0, after == (YOUNG_THRESHOLD, *before[1:]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["True", "True"]


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _oversized_chunked_posts(port: int, n: int, limit: int) -> None:
    piece = b"x" * (256 * 1024)
    for _ in range(n):
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            )
            with contextlib.suppress(OSError):  # the sidecar may answer and close mid-body
                for _ in range(limit // len(piece) + 2):
                    s.sendall(b"%x\r\n" % len(piece) + piece + b"\r\n")
            s.settimeout(5)
            assert s.recv(12).startswith(b"HTTP/1.1 413")


async def test_lanes_serve_lets_go_of_the_bodies_it_refuses(tmp_path):
    """`lanes serve` (its collector tuned by `dedicate_gc`) answers 60 chunked bodies over
    `max_body_bytes` (4 MiB) with 413 and keeps none of them: its resident memory grows by far
    less than the 240 MiB they carried (a refusal held in a reference cycle kept each one)."""
    config = {
        "lanes": [
            {
                "name": "local",
                "module": "openai_compatible",
                "base_url": "http://127.0.0.1:9/v1",
                "api_key_env": "",
                "free_tier": {"kind": "local"},
                "models": [{"id": "m"}],
            }
        ],
        "server": {"max_body_bytes": 4 * 1024 * 1024},
    }
    async with open_sidecar_process(config, tmp_path) as sidecar:
        pid, port = sidecar.process.pid, int(sidecar.base.rsplit(":", 1)[1])
        before = _rss_mb(pid)
        await trio.to_thread.run_sync(_oversized_chunked_posts, port, 60, 4 * 1024 * 1024)
        grown = _rss_mb(pid) - before
    assert grown < 100, f"RSS grew by {grown:.0f} MB"

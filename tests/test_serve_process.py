"""`lanes serve` as a real process: fast startup with dead providers, graceful SIGTERM."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time

import httpx2
import trio

from lanes.testing.fakes import answer, open_fake


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def toml_value(value) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)


def write_config(tmp_path, lanes: list[dict]) -> str:
    lines = ['state = ":memory:"', "[policy]", 'free_tier_fallback = "allow"']
    for lane in lanes:
        lines += ["[[lanes]]"] + [f"{k} = {toml_value(v)}" for k, v in lane.items() if k != "models"]
        for model in lane.get("models", []):
            lines += ["[[lanes.models]]"] + [f"{k} = {toml_value(v)}" for k, v in model.items()]
    path = tmp_path / "lanes.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


async def wait_for_health(base: str, within_s: float) -> float:
    start = time.monotonic()
    async with httpx2.AsyncClient(trust_env=False) as http:
        while time.monotonic() - start < within_s:
            try:
                if (await http.get(f"{base}/health", timeout=0.2)).status_code == 200:
                    return time.monotonic() - start
            except httpx2.TransportError:
                await trio.sleep(0.02)
    raise AssertionError(f"/health did not answer within {within_s}s")


async def test_startup_with_dead_providers_and_graceful_shutdown(tmp_path):
    """Every hosted provider refuses: /health answers fast, one line per dead provider; SIGTERM
    lets the in-flight job finish and the process exits 0."""
    port, dead = free_port(), free_port()
    async with open_fake("local", models=("local-model",)) as local:
        local.script("local-model", answer(delay_s=1.0))
        config = write_config(tmp_path, [
            {"name": "free", "module": "openai_compatible", "base_url": f"http://127.0.0.1:{dead}/v1",
             "free_tier": {"kind": "rate_limited"}, "models": [{"id": "f"}]},
            {"name": "local", "module": "ollama", "base_url": local.base_url, "models": [{"id": "local-model"}]},
        ])
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "lanes", "serve", "--config", config, "--port", str(port)],
            stderr=subprocess.PIPE)
        base = f"http://127.0.0.1:{port}"
        try:
            try:
                startup = await wait_for_health(base, 10.0)
            except AssertionError:
                process.kill()
                raise AssertionError((await process.stderr.receive_some(1 << 20)).decode()) from None
            box = {}

            async def in_flight() -> None:
                async with httpx2.AsyncClient(trust_env=False, timeout=10) as http:
                    box["r"] = await http.post(f"{base}/v1/chat/completions",
                                               json={"messages": [{"role": "user", "content": "hi"}]})

            async with trio.open_nursery() as nursery:
                nursery.start_soon(in_flight)
                await trio.sleep(0.3)  # the job is now waiting on the slow local model
                process.send_signal(signal.SIGTERM)
            code = await process.wait()
        finally:
            if process.returncode is None:
                process.kill()
        log = (await process.stderr.receive_some(1 << 20)).decode() if process.stderr else ""
    assert box["r"].status_code == 200 and box["r"].headers["x-lanes-lane"] == "local"
    assert code == 0
    assert len(re.findall(r"lane free: provider unreachable at startup", log)) == 1, log
    assert "shutting down" in log
    assert startup < 5.0  # generous for a cold interpreter; the bench measures the real figure

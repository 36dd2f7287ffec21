"""Review "ops" findings (issues 27/28): reloads, signals and secrets in an operator's life."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
import trio
from test_workers import TWO, limited, views_by_worker

from lanes._core.runtime.secrets import read_key
from lanes.testing import open_fake
from lanes.testing.harness.configs import KEYS
from lanes.testing.harness.processes import dump_toml, free_port, open_sidecar_process

KEY = "gsk_live_ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789abcd"


def test_a_key_pasted_as_the_variable_name_is_never_shown():
    """A key written where its variable's name goes: the reason a lane is off never shows it."""
    key, why = read_key({}, KEY)
    assert key is None and KEY not in why and "reads like a key" in why
    assert read_key({"GROQ_API_KEY": "x" * 8}, "GROQ_API_KEY") == ("x" * 8, "")  # a name is shown
    assert read_key({}, "GROQ_API_KEY") == (None, "GROQ_API_KEY is not set")


async def test_a_reload_to_an_empty_file_keeps_the_running_config(tmp_path):
    """SIGHUP while the file is truncated to 0 bytes (cut mid-write; --port on the command line):
    the reload is refused and every worker keeps its lanes."""
    port = free_port()
    async with open_fake("paid", models=("paid-model",)) as paid:
        args = (*TWO, "--port", str(port))
        config = limited(paid.base_url)
        async with open_sidecar_process(config, tmp_path, env=KEYS, args=args, port=port) as sc:
            (tmp_path / "lanes.toml").write_text(dump_toml(config))  # no [server]: --port binds
            sc.process.send_signal(signal.SIGHUP)
            await sc.until_host(lambda h: h["reloads"] == 1)
            (tmp_path / "lanes.toml").write_text("")
            sc.process.send_signal(signal.SIGHUP)
            host = await sc.until_host(lambda h: h["reloads"] == 2)
            views = await views_by_worker(sc.base)
    assert host["last_reload"]["ok"] is False
    assert {w: [lane["name"] for lane in v["lanes"]] for w, v in views.items()} == {
        1: ["paid"],
        2: ["paid"],
    }


@pytest.mark.xfail(strict=True, reason="review: SIGHUP before the parent's handler kills it")
async def test_a_sighup_during_startup_does_not_kill_the_parent(tmp_path):
    """`lanes serve --workers 2` sent SIGHUP as it starts (systemd's reload, a storm): the parent
    does not die of it — it reloads or ignores it, and stops on SIGTERM with exit 0."""
    command = [sys.executable, "-m", "lanes", "serve", "--simulate", "--workers", "2"]
    command += ["--port", str(free_port())]
    process = await trio.lowlevel.open_process(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        process.send_signal(signal.SIGHUP)
        with trio.move_on_after(5):
            await process.wait()
    finally:
        if process.returncode is None:
            process.terminate()
            with trio.fail_after(30):
                await process.wait()
    assert process.returncode == 0

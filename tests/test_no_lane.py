"""When no lane can serve, the sidecar says so once at start, with what would fix it; `/v1/lanes`
marks a lane whose provider accepted no connection (not free now, and why) and lists every
configured lane, those that did not load included."""

from __future__ import annotations

import logging
import socket
from typing import Any

import pytest
import trio

import lanes
from lanes._http.state import lanes_state
from lanes.harness.configs import free_lane, lane, local_lane
from lanes.testing import open_fake


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(*lane_tables: dict[str, Any]) -> dict[str, Any]:
    return {"state": ":memory:", "lanes": list(lane_tables)}


async def _started(
    config: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> tuple[list[str], dict[str, Any]]:
    """The warning lines of the first seconds of a dispatcher over `config`, and its /v1/lanes."""
    caplog.set_level(logging.WARNING, logger="lanes")
    env = {"FREE_API_KEY": "k"}  # the fake free lane's; GROQ_API_KEY is not set
    async with lanes.open_dispatcher(lanes.load_config(config, env=env), env=env) as dispatcher:
        await trio.sleep(3)  # the reachability checks give up within 2 s
        state = lanes_state(dispatcher.statistics(), trio.current_time())
    return [r.getMessage() for r in caplog.records], state


async def test_no_lane_can_serve_is_said_once_with_the_fix(caplog, autojump_clock):
    """A local server not running and a free lane without its key: one line says no lane can
    serve, naming the key to set and the server to start — and no line promises other lanes."""
    port = _closed_port()
    local = local_lane("ollama", f"http://127.0.0.1:{port}/v1", module="ollama")
    free = lane("groq", "http://127.0.0.1:9/v1", ["m"], kind="rate_limited", key_env="GROQ_API_KEY")
    said, state = await _started(_config(local, free), caplog)
    summary = [line for line in said if line.startswith("no lane can serve")]
    assert len(summary) == 1, said
    assert "set $GROQ_API_KEY (groq)" in summary[0]
    assert f"start the server at http://127.0.0.1:{port}/v1 (ollama)" in summary[0]
    assert not any("serving from the others" in line for line in said), said
    # the page's data: the lane is marked, its models are not free now, every lane is listed
    (ollama,) = state["lanes"]
    assert ollama["unreachable"].startswith("unreachable at startup")
    assert all(not m["free_now"] and m["reason"] == ollama["unreachable"] for m in ollama["models"])
    listed = {lane["name"]: lane["state"] for lane in state["configured"]}
    assert listed == {"ollama": "unreachable", "groq": "unavailable"}


async def test_a_dead_lane_beside_a_live_one_is_routed_around_without_the_summary(
    caplog, autojump_clock
):
    """One lane down, another up: the dead one's line says the others serve; no summary."""
    port = _closed_port()
    async with open_fake("free", models=("free-model",)) as fake:
        live = free_lane("free", fake.base_url)
        dead = local_lane("ollama", f"http://127.0.0.1:{port}/v1", module="ollama")
        said, state = await _started(_config(dead, live), caplog)
    assert not any(line.startswith("no lane can serve") for line in said), said
    assert any(
        line.startswith("lane ollama: provider unreachable at startup")
        and line.endswith("serving from the others until it answers")
        for line in said
    ), said
    listed = {lane["name"]: lane["state"] for lane in state["configured"]}
    assert listed == {"ollama": "unreachable", "free": "serving"}

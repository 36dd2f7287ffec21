"""The benchmark's floor and limit peers pass answers on whole: a peer that dropped or garbled
bytes would look fast, and every ratio measured against it would be a lie."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from functools import partial
from typing import Any

import httpx2
import pytest

from bench import agent, agentbodies, peers
from lanes.testing import open_fake

BODY = {"model": "m", "messages": [{"role": "user", "content": "Say the pangram."}]}


async def exchange(url: str, stream: bool) -> tuple[int, bytes]:
    async with (
        httpx2.AsyncClient(trust_env=False, timeout=30) as http,
        http.stream("POST", f"{url}/chat/completions", json={**BODY, "stream": stream}) as r,
    ):
        return r.status_code, b"".join([part async for part in r.aiter_bytes()])


async def test_floor_and_limit_pass_on_what_the_upstream_says(tmp_path):
    """Through the floors (json's and msgspec's) and the limit, a JSON answer and a stream arrive
    as the upstream sent them: the same answer, every event, and the stream's [DONE]."""
    async with open_fake("up", models=("m",)) as fake:
        direct_json = await exchange(fake.base_url, False)
        direct_sse = await exchange(fake.base_url, True)
        for peer in (peers.floor, partial(peers.floor, fast=True), peers.limit):
            async with peer(fake.base_url, tmp_path) as p:
                assert await exchange(p.url, False) == direct_json
                assert await exchange(p.url, True) == direct_sse
    assert json.loads(direct_json[1])["choices"][0]["message"]["content"]
    assert direct_json[0] == direct_sse[0] == 200
    assert direct_sse[1].endswith(b"data: [DONE]\n\n") and direct_sse[1].count(b"data: ") > 3


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("door", ["responses", "messages"])
async def test_at_a_translated_door_the_floor_translates_as_lanes_does(tmp_path, door, fast):
    """At the Messages and Responses doors the floor sends upstream the very chat request lanes'
    translation makes of the body (`bench.agentbodies.sent_upstream`) and answers in the door's
    shape, whole and streamed — not the body as it came, which the upstream would answer with
    text."""
    body = agentbodies.agent_body(1, door)
    async with open_fake("up", models=(body["model"],)) as fake:
        async with peers.floor(fake.base_url, tmp_path, fast=fast) as p:
            whole = await _post(f"{p.url}{agent.DOORS[door]}", body)
            streamed = await _post(f"{p.url}{agent.DOORS[door]}", {**body, "stream": True})
        sent = [entry.body for entry in fake.log]
    assert sent == [agentbodies.sent_upstream(door, body, kind) for kind in ("json", "sse")]
    answer, events = json.loads(whole), streamed.decode()
    if door == "responses":
        assert answer["object"] == "response"
        assert [item["type"] for item in answer["output"]] == ["function_call"]
        assert events.startswith("event: response.created\n")
        assert "event: response.function_call_arguments.delta\n" in events
        assert events.rstrip().rsplit("\n\n", 1)[-1].startswith("event: response.completed\n")
    else:
        assert answer["type"] == "message"
        assert [block["type"] for block in answer["content"]] == ["tool_use"]
        assert events.startswith("event: message_start\n")
        assert "event: content_block_delta\n" in events
        assert events.rstrip().endswith('data: {"type":"message_stop"}')


async def _post(url: str, body: dict[str, Any]) -> bytes:
    async with httpx2.AsyncClient(trust_env=False, timeout=30) as http:
        response = await http.post(url, json=body)
    assert response.status_code == 200, response.text
    return response.content


_BURN = """
import sys, threading, time
def burn():
    while time.thread_time() < 0.15:
        pass
worker = threading.Thread(target=burn)
worker.start()
worker.join()  # its CPU is the process's, though the thread has ended
print(repr(time.process_time()), flush=True)
sys.stdin.read()
"""


def test_a_peers_cpu_is_its_process_clock_finer_than_procs_ticks():
    """The CPU a peer used is its process's CPU clock (an ended thread's time in it), finer than
    /proc's ticks of 10 ms, which put a cell of 80 requests ±0.125 ms per request off: the
    process's own figure within 2 ms (the ticks read 0.17 for 0.178); and a process gone is an
    error, not a figure of 0."""
    child = subprocess.Popen(
        [sys.executable, "-c", _BURN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        own = float(child.stdout.readline())
        read = peers.process_cpu_s(child.pid)
        try:
            time.clock_gettime(((~child.pid) << 3) | 2)
        except OSError:  # the fallback, by design; its ticks are what this test can not hold
            pytest.skip("this kernel gives no other process's CPU clock: /proc's ticks are read")
        assert own >= 0.15
        assert own <= read < own + 0.002
    finally:
        child.communicate("")
    with pytest.raises(ProcessLookupError):
        peers.process_cpu_s(child.pid)

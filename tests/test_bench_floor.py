"""The benchmark's floor and limit peers pass answers on whole: a peer that dropped or garbled
bytes would look fast, and every ratio measured against it would be a lie."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx2

from bench import peers
from lanes.testing import open_fake

BODY = {"model": "m", "messages": [{"role": "user", "content": "Say the pangram."}]}


async def exchange(url: str, stream: bool) -> tuple[int, bytes]:
    async with (
        httpx2.AsyncClient(trust_env=False, timeout=30) as http,
        http.stream("POST", f"{url}/chat/completions", json={**BODY, "stream": stream}) as r,
    ):
        return r.status_code, b"".join([part async for part in r.aiter_bytes()])


async def test_floor_and_limit_pass_on_what_the_upstream_says(tmp_path):
    """Through the floor and the limit, a JSON answer and a stream arrive as the upstream sent
    them: the same answer, every event, and the stream's [DONE]."""
    async with open_fake("up", models=("m",)) as fake:
        direct_json = await exchange(fake.base_url, False)
        direct_sse = await exchange(fake.base_url, True)
        for peer in (peers.floor, peers.limit):
            async with peer(fake.base_url, tmp_path) as p:
                assert await exchange(p.url, False) == direct_json
                assert await exchange(p.url, True) == direct_sse
    assert json.loads(direct_json[1])["choices"][0]["message"]["content"]
    assert direct_json[0] == direct_sse[0] == 200
    assert direct_sse[1].endswith(b"data: [DONE]\n\n") and direct_sse[1].count(b"data: ") > 3


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


def test_a_peers_cpu_is_read_to_the_nanosecond_with_its_ended_threads():
    """The CPU a peer used is its process's CPU clock: an ended thread's time included, and
    finer than /proc's ticks of 10 ms (which put a cell of 80 requests ±0.125 ms per request
    off) — the process's own figure, to the millisecond; and nothing for a process gone."""
    child = subprocess.Popen(
        [sys.executable, "-c", _BURN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        own = float(child.stdout.readline())
        read = peers.process_cpu_s(child.pid)
        assert own >= 0.15
        assert own <= read < own + 0.002
    finally:
        child.communicate("")
    assert peers.process_cpu_s(child.pid) == 0.0

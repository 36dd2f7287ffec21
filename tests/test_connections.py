"""One connection model: HTTP/1.1 only on the plain port, and a client that goes away — closed,
reset or half-closed, mid job or mid stream, on every door — takes its job with it."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest
import trio

from lanes.testing import FakeProvider, answer
from lanes.testing.clients import (
    H2_PREFACE,
    H2_SETTINGS,
    H2C_UPGRADE,
    LEAVING,
    Leaving,
    http_request,
    leave,
    read_until_closed,
)
from lanes.testing.configs import open_sidecar

MESSAGES = [{"role": "user", "content": "Say the pangram."}]
OK = {"messages": MESSAGES}
LOCAL = ("local", "local", ["local-model"])
PAID = ("paid", "paid", ["paid-model"])


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


async def _exchange(port: int, data: bytes) -> bytes:
    """Send `data` on a fresh connection and read until the sidecar closes it (at most 10 s)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(data)
        with trio.move_on_after(10):
            return await read_until_closed(stream)
    return b"still open after 10 s"


def _status(response: bytes) -> int:
    return int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/1.1 ") else 0


async def test_the_http2_preface_is_refused_and_the_connection_closed(autojump_clock):
    """A client speaking HTTP/2 with prior knowledge gets an OpenAI-shaped HTTP/1.1 505 and a
    closed connection, never an HTTP/2 session."""
    async with open_sidecar(LOCAL) as (url, _):
        response = await _exchange(_port(url), H2_PREFACE + H2_SETTINGS)
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 505"), response[:80]
    assert json.loads(body)["error"]["code"] == "http_version_not_supported"


async def test_an_h2c_upgrade_is_ignored(autojump_clock):
    """`Upgrade: h2c` is not taken up: the request is answered over HTTP/1.1, never with a 101."""
    async with open_sidecar(LOCAL) as (url, _):
        headers = {**H2C_UPGRADE, "connection": "close, Upgrade, HTTP2-Settings"}
        response = await _exchange(_port(url), http_request("GET", "/health", headers=headers))
    assert _status(response) == 200, response[:80]
    assert response.endswith(b'{"status":"ok"}')


async def test_fifty_http2_connections_leave_the_cap_free(autojump_clock):
    """50 connections sending the HTTP/2 preface and SETTINGS, against a cap of 20: each is
    refused and closed at once, and /health answers 200 (they used to hold the cap: 503)."""
    async with open_sidecar(LOCAL, server={"max_connections": 20}) as (url, _):
        port = _port(url)
        answers: list[bytes] = []
        held: list[trio.SocketStream] = []
        async with trio.open_nursery() as nursery:

            async def hostile() -> None:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                held.append(stream)
                await stream.send_all(H2_PREFACE + H2_SETTINGS)
                with trio.move_on_after(10):
                    answers.append(await read_until_closed(stream))

            for _ in range(50):
                nursery.start_soon(hostile)
        health = await _exchange(
            port, http_request("GET", "/health", headers={"connection": "close"})
        )
        for stream in held:
            await stream.aclose()
    assert len(answers) == 50 and {_status(a) for a in answers} <= {505, 503}
    assert _status(health) == 200, health[:80]


async def _leave_mid_job(
    url: str, fake: FakeProvider, how: Leaving, path: str = "/v1/chat/completions", body: Any = None
) -> float:
    """Send a job whose upstream answer takes 2 s, leave `how` once the upstream has it, and
    return how long (trio clock) the upstream request ran on after the client left."""
    stream = await trio.open_tcp_stream("127.0.0.1", _port(url))
    try:
        await stream.send_all(http_request("POST", path, body or OK))
        with trio.fail_after(1):
            await fake.wait_for(lambda f: f.in_flight)
        left_at = trio.current_time()
        await leave(stream, how)
        with trio.fail_after(10):
            await fake.wait_for(lambda f: not f.in_flight)
    finally:
        await stream.aclose()
    assert fake.departed, "the upstream answered in full: nothing let go of its request"
    return fake.departed[-1].at - left_at


@pytest.mark.parametrize("how", LEAVING)
async def test_a_client_that_leaves_a_job_cancels_its_upstream_request(how, autojump_clock):
    """A non-streamed job whose client closes, resets or half-closes its connection is cancelled at
    once: the upstream sees its request dropped, and the job is audited `abandoned`."""
    async with (
        open_sidecar(LOCAL) as (url, fakes),
        httpx2.AsyncClient(trust_env=False) as http,
    ):
        fakes["local"].script("local-model", answer(delay_s=2.0))
        ran_on_s = await _leave_mid_job(url, fakes["local"], how)
        recent = (await http.get(f"{url}/lanes")).json()["recent"]
    assert ran_on_s < 0.1
    assert recent[0]["outcome"] == "abandoned"

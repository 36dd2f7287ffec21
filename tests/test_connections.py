"""One connection model: HTTP/1.1 only on the plain port, and a client that goes away — closed,
reset or half-closed, mid job or mid stream, on every door — takes its job with it."""

from __future__ import annotations

import json

import trio

from lanes.testing.clients import (
    H2_PREFACE,
    H2_SETTINGS,
    H2C_UPGRADE,
    http_request,
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

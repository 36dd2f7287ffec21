"""Clients that misbehave on purpose over raw loopback sockets: ones that go away mid-request in
every way TCP allows, and ones that speak HTTP/2 to an HTTP/1.1 port.

```python
stream = await trio.open_tcp_stream("127.0.0.1", port)
await stream.send_all(http_request("POST", "/v1/chat/completions", {"messages": [...]}))
await leave(stream, "reset")          # close, reset or half-close
```
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any, Literal

import trio

Leaving = Literal["close", "reset", "half-close"]
#: Every way a client can leave a request it sent: close its socket (a FIN), reset it (an RST, as
#: SO_LINGER 0 makes `close` do), or shut down its sending side only and keep reading (a FIN too).
LEAVING: tuple[Leaving, ...] = ("close", "reset", "half-close")
#: What an HTTP/2 client sends first over cleartext with prior knowledge (RFC 9113 §3.4): the
#: connection preface, then its SETTINGS frame (empty: the defaults).
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
H2_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # length 0, type SETTINGS, no flags, stream 0
#: An HTTP/1.1 request's headers asking to switch to HTTP/2 (RFC 7540 §3.2, `h2c`).
H2C_UPGRADE = {
    "connection": "Upgrade, HTTP2-Settings",
    "upgrade": "h2c",
    "http2-settings": "AAMAAABkAAQCAAAAAAIAAAAA",
}


def http_request(
    method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
) -> bytes:
    """One HTTP/1.1 request's bytes to 127.0.0.1: `body` (JSON) with its length, if given."""
    raw = b"" if body is None else json.dumps(body).encode()
    lines = [f"{method} {path} HTTP/1.1", "host: 127.0.0.1"]
    if body is not None:
        lines += ["content-type: application/json", f"content-length: {len(raw)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + raw


async def leave(stream: trio.SocketStream, how: Leaving) -> None:
    """Go away from `stream` as `how` says. A half-closed stream is left open for reading: the
    caller closes it."""
    if how == "half-close":
        await stream.send_eof()
        return
    if how == "reset":
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    await stream.aclose()


async def read_until_closed(stream: trio.SocketStream, *, limit: int = 1 << 20) -> bytes:
    """Everything the peer sends until it closes (at most `limit` bytes). The caller owns the
    deadline."""
    received = bytearray()
    try:
        while len(received) < limit and (chunk := await stream.receive_some(65536)):
            received += chunk
    except trio.BrokenResourceError:
        pass  # reset: what came before it is the answer
    return bytes(received)


__all__ = [
    "H2C_UPGRADE",
    "H2_PREFACE",
    "H2_SETTINGS",
    "LEAVING",
    "Leaving",
    "http_request",
    "leave",
    "read_until_closed",
]

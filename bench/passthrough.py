"""The limit: a bare pass-through proxy on our stack (hypercorn's trio worker + httpx2), no routing.

`python -m bench.passthrough PORT UPSTREAM_BASE_URL` forwards POST /v1/chat/completions, streaming
the answer back chunk by chunk. What this stack could do at best: the request goes straight to the
connection pool's transport, past the client's layers (as lanes' own requests do).
"""

from __future__ import annotations

import sys

import httpx2
import trio
from hypercorn.config import Config
from hypercorn.trio import serve


async def request_body(scope, receive, send) -> bytes | None:
    """The request's body — or None for what is not a request (lifespan is answered here)."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return None
    if scope["type"] != "http":
        return None
    parts = []  # joined once: adding each piece to the last copies a 512 KB body eight times
    while True:
        message = await receive()
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(parts)


def build(upstream: str, transport: httpx2.AsyncHTTPTransport):
    url = httpx2.URL(upstream + "/chat/completions")

    async def app(scope, receive, send):
        body = await request_body(scope, receive, send)
        if body is None:
            return
        request = httpx2.Request(
            "POST", url, content=body, headers={"content-type": "application/json"}
        )
        response = await transport.handle_async_request(request)
        try:
            headers = [
                (b"content-type", response.headers.get("content-type", "application/json").encode())
            ]
            await send(
                {"type": "http.response.start", "status": response.status_code, "headers": headers}
            )
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await response.aclose()

    return app


async def main(port: int, upstream: str, build=build) -> None:
    """Serve `build(upstream, transport)` on 127.0.0.1:`port`."""
    limits = httpx2.Limits(max_connections=2048, max_keepalive_connections=256)
    transport = httpx2.AsyncHTTPTransport(limits=limits, trust_env=False)
    async with transport:
        config = Config()
        config.bind = [f"127.0.0.1:{port}"]
        config.accesslog = None
        config.backlog = (
            4096  # as the sidecar: a burst of connects must not overflow the listen queue
        )
        await serve(build(upstream, transport), config)


if __name__ == "__main__":
    trio.run(main, int(sys.argv[1]), sys.argv[2])

"""The limit: a bare pass-through proxy on our stack (hypercorn's trio worker + httpx2), no routing.

`python -m bench.passthrough PORT UPSTREAM_BASE_URL` forwards POST /v1/chat/completions, streaming
the answer back chunk by chunk. What this stack could do at best.
"""

from __future__ import annotations

import sys

import httpx2
import trio
from hypercorn.config import Config
from hypercorn.trio import serve


def build(upstream: str, client: httpx2.AsyncClient):
    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        request = client.build_request(
            "POST",
            upstream + "/chat/completions",
            content=body,
            headers={"content-type": "application/json"},
        )
        response = await client.send(request, stream=True)
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


async def main(port: int, upstream: str) -> None:
    limits = httpx2.Limits(max_connections=2048, max_keepalive_connections=256)
    async with httpx2.AsyncClient(
        limits=limits, timeout=httpx2.Timeout(None), trust_env=False
    ) as client:
        config = Config()
        config.bind = [f"127.0.0.1:{port}"]
        config.accesslog = None
        config.backlog = (
            4096  # as the sidecar: a burst of connects must not overflow the listen queue
        )
        await serve(build(upstream, client), config)


if __name__ == "__main__":
    trio.run(main, int(sys.argv[1]), sys.argv[2])

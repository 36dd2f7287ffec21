"""The floor: the least a router must do per request on our stack, and nothing more.

`python -m bench.floor PORT UPSTREAM_BASE_URL` is the limit (`bench.passthrough`) plus only the work
no router can skip: the request is read as JSON (to know its model) and written again (to name the
upstream's model), sent through the pool's transport directly (as lanes does), and the answer is
checked — a JSON answer parsed whole, each event of a stream parsed (to see its finish, usage or
error) and passed on as the upstream wrote it — and three headers say who served. No policy, no
breaker, no ledger, no journal, no Starlette. Lanes measured beside it shows what lanes' own routing
costs; the floor beside the limit shows what any router on this stack costs.
"""

from __future__ import annotations

import json
import sys

import httpx2
import trio
from hypercorn.config import Config
from hypercorn.trio import serve

HEADERS = [(b"x-served-by", b"floor"), (b"x-model", b"m"), (b"x-request-id", b"r")]


def build(upstream: str, transport: httpx2.AsyncHTTPTransport):
    url = httpx2.URL(upstream + "/chat/completions")

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        if scope["type"] != "http":
            return
        parts = []
        while True:
            message = await receive()
            parts.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        job = json.loads(b"".join(parts))
        job["model"] = str(job.get("model", ""))
        body = json.dumps(job, separators=(",", ":")).encode()
        request = httpx2.Request(
            "POST", url, content=body, headers={"content-type": "application/json"}
        )
        response = await transport.handle_async_request(request)
        try:
            kind = response.headers.get("content-type", "application/json")
            head = [(b"content-type", kind.encode()), *HEADERS]
            if not job.get("stream"):
                raw = b"".join([part async for part in response.aiter_bytes()])
                json.loads(raw)
                await send(
                    {"type": "http.response.start", "status": response.status_code, "headers": head}
                )
                await send({"type": "http.response.body", "body": raw})
                return
            await send(
                {"type": "http.response.start", "status": response.status_code, "headers": head}
            )
            rest = b""
            async for piece in response.aiter_bytes():
                events = (rest + piece).split(b"\n\n")
                rest = events.pop()
                for event in events:
                    if event.startswith(b"data: ") and event[6:] != b"[DONE]":
                        json.loads(event[6:])
                if events:
                    out = b"\n\n".join(events) + b"\n\n"
                    await send({"type": "http.response.body", "body": out, "more_body": True})
            await send({"type": "http.response.body", "body": rest, "more_body": False})
        finally:
            await response.aclose()

    return app


async def main(port: int, upstream: str) -> None:
    limits = httpx2.Limits(max_connections=2048, max_keepalive_connections=256)
    transport = httpx2.AsyncHTTPTransport(limits=limits, trust_env=False)
    async with transport:
        config = Config()
        config.bind = [f"127.0.0.1:{port}"]
        config.accesslog = None
        config.backlog = 4096
        await serve(build(upstream, transport), config)


if __name__ == "__main__":
    trio.run(main, int(sys.argv[1]), sys.argv[2])

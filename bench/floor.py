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

from bench.passthrough import main, request_body

HEADERS = [(b"x-served-by", b"floor"), (b"x-model", b"m"), (b"x-request-id", b"r")]


def build(upstream: str, transport: httpx2.AsyncHTTPTransport):
    url = httpx2.URL(upstream + "/chat/completions")

    async def app(scope, receive, send):
        raw_job = await request_body(scope, receive, send)
        if raw_job is None:
            return
        job = json.loads(raw_job)
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


if __name__ == "__main__":
    trio.run(main, int(sys.argv[1]), sys.argv[2], build)

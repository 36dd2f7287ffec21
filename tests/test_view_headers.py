"""Every answer of every route in the route table — a view, an action, a refusal, a stream, a route
that is not there — is kept by no cache and sniffed by no browser: `Cache-Control: no-store` and
`X-Content-Type-Options: nosniff` (the views carry account data: spend, clients, jobs)."""

from __future__ import annotations

import re

import httpx2

from lanes._http.app import ROUTES
from sidecar import open_sidecar

LANES = (("local", "local", ["local-model"]), ("paid", "paid", ["paid-model"]))
PARAM = re.compile(r"\{[^}]+\}")


def private(response: httpx2.Response) -> bool:
    return (
        response.headers.get("cache-control") == "no-store"
        and response.headers.get("x-content-type-options") == "nosniff"
    )


async def test_every_route_answers_with_no_store_and_nosniff():
    """Each row of ROUTES, each of its methods (its path parameters filled in), answers — 2xx or a
    refusal — with both headers; so do a stream, an unknown path and a wrong method."""
    seen: dict[str, int] = {}
    async with (
        open_sidecar(*LANES) as (url, _),
        httpx2.AsyncClient(base_url=url[:-3], trust_env=False, timeout=30) as http,
    ):
        for row in ROUTES:
            path = PARAM.sub("x", row.path)
            for method in row.methods:
                body: dict[str, object] | None = {} if method != "GET" else None
                response = await http.request(method, path, json=body)
                seen[f"{method} {row.path}"] = response.status_code
                assert private(response), (method, row.path, response.status_code)
        async with http.stream(
            "POST",
            "/v1/chat/completions",
            json={"stream": True, "messages": [{"role": "user", "content": "hi"}]},
        ) as stream:
            assert stream.status_code == 200 and private(stream)
            await stream.aread()
        for response in (
            await http.get("/v1/nowhere"),
            await http.delete("/v1/lanes"),
            await http.get("/v1/lanes", headers={"x-lanes-deadline-ms": "x"}),
        ):
            assert private(response), (response.request.url, response.status_code)
    assert len(seen) == sum(len(row.methods) for row in ROUTES)
    assert seen["GET /v1/lanes"] == 200 and seen["GET /v1/report"] == 200

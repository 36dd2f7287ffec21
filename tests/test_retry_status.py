"""Status codes that tell a client whether to retry: 503 and 429 only for "try again later", and
always with `Retry-After`; a request no candidate could ever serve is a 400 naming why; a pinned
model its upstream says does not exist is a 404 — on every door, streams before their first byte
included."""

from __future__ import annotations

from typing import Any

import httpx2
from hypothesis import given
from hypothesis import strategies as st

from lanes._core import errors
from lanes._http.errors import error_response, job_failed
from lanes.testing import status
from sidecar import open_sidecar

USER: Any = [{"role": "user", "content": "Say hi"}]
EMBEDDING = {"models": [{"id": "chat"}, {"id": "emb", "embedding": True}]}


def requests_on_every_door(model: str, **extra: Any) -> list[tuple[str, str, dict[str, Any]]]:
    """(name, path, body) of one request per door: chat, Responses and Messages, each plain and
    streamed."""
    chat = {"model": model, "messages": USER, **extra}
    responses = {"model": model, "input": "Say hi", **extra}
    if "max_tokens" in extra:
        responses["max_output_tokens"] = responses.pop("max_tokens")
    messages = {"model": model, "messages": USER, "max_tokens": 64, **extra}
    doors = [
        ("chat", "/chat/completions", chat),
        ("responses", "/responses", responses),
        ("messages", "/messages", messages),
    ]
    return [(n, p, b) for n, p, b in doors] + [
        (f"{n} stream", p, b | {"stream": True}) for n, p, b in doors
    ]


async def answers(url: str, doors: list[tuple[str, str, dict[str, Any]]]) -> dict[str, Any]:
    """Each door's answer to its request."""
    out = {}
    async with httpx2.AsyncClient(trust_env=False, timeout=10) as http:
        for name, path, body in doors:
            out[name] = await http.post(url + path, json=body)
    return out


def error_of(response: httpx2.Response) -> tuple[int, str | None]:
    """(status, the error's type on Messages or its code elsewhere)."""
    body = response.json()
    if body.get("type") == "error":
        return response.status_code, body["error"]["type"]
    return response.status_code, body["error"]["code"]


_FAILURES = [
    errors.JobFailed("x"),
    errors.NoLaneAvailable("x"),
    errors.DeadlineExceeded("x"),
    errors.UnknownModel("x"),
    errors.FallbackDenied("x"),
    errors.StreamInterrupted("x"),
    errors.FreeTierExhausted("x", retry_after_s=12.5),
    errors.PaidBudgetExhausted("x"),
    errors.GovernorExhausted("x", retry_after_s=None),
    errors.FallbackNeedsApproval("x", approval_id="a1"),
]


@given(
    st.sampled_from(_FAILURES)
    | st.builds(errors.UpstreamRejected, st.just("x"), upstream_status=st.integers(400, 599))
)
def test_every_try_again_later_carries_retry_after(failure):
    """Whatever failed, a 429 or a 503 carries `Retry-After` in whole seconds, never 0."""
    status_code, _, headers = job_failed(failure)
    if status_code in (429, 503):
        assert int(headers["Retry-After"]) >= 1
    plain = error_response(status_code, "x", "y")
    assert (status_code in (429, 503)) == ("retry-after" in plain.headers)


async def test_not_now_is_a_503_with_retry_after_on_every_door():
    """Paid fallback off and the only candidate paid: "not now" on chat, Responses, Messages
    (plain and streamed) and embeddings — a 503 with `Retry-After`, never a 400."""
    paid_embedding = {"models": [{"id": "emb", "embedding": True, "input_usd_per_mtok": 10.0}]}
    async with open_sidecar(
        ("paid", "paid", ["paid-model"]),
        ("vectors", "paid", ["emb"], paid_embedding),
        policy={"free_tier_fallback": "off"},
    ) as (url, fakes):
        got = await answers(
            url,
            [
                *requests_on_every_door("auto"),
                ("embeddings", "/embeddings", {"model": "emb", "input": "x"}),
            ],
        )
    assert {name: r.status_code for name, r in got.items()} == dict.fromkeys(got, 503)
    assert all(r.headers["retry-after"] == "1" for r in got.values())
    assert error_of(got["messages stream"]) == (503, "overloaded_error")
    assert fakes["paid"].requests() == [] and fakes["vectors"].requests() == []


async def test_a_failing_lane_is_a_503_with_retry_after():
    """Every candidate faulting (5xx) is a 503 `no_lane_available` with `Retry-After`, plain and
    before a stream's first byte."""
    async with open_sidecar(("local", "local", ["local-model"])) as (url, fakes):
        fakes["local"].script("local-model", status(503))
        got = await answers(
            url, requests_on_every_door("auto")[:1] + requests_on_every_door("auto")[3:4]
        )
    assert [error_of(r) for r in got.values()] == [(503, "no_lane_available")] * 2
    assert all(int(r.headers["retry-after"]) >= 1 for r in got.values())


async def test_not_ready_says_when_to_look_again():
    """`/ready` with its only lane switched off is a 503 with `Retry-After`."""
    async with (
        open_sidecar(("local", "local", ["local-model"])) as (url, fakes),
        httpx2.AsyncClient(trust_env=False, timeout=10) as http,
    ):
        base = url.removesuffix("/v1")
        ready = await http.get(f"{base}/ready")
        switched = await http.post(f"{url}/lanes/local/off", json={})
        unready = await http.get(f"{base}/ready")
    assert ready.status_code == 200 and "retry-after" not in ready.headers
    assert switched.status_code == 200
    assert unready.status_code == 503 and unready.headers["retry-after"] == "1"

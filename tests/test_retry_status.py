"""Status codes that tell a client whether to retry: 503 and 429 only for "try again later", and
always with `Retry-After`; a request no candidate could ever serve is a 400 naming why; a pinned
model its upstream says does not exist is a 404 — on every door, streams before their first byte
included."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lanes import Job
from lanes._core.model import errors
from lanes._core.model.candidates import Candidate
from lanes._core.policy.needs import needs_of
from lanes._core.policy.policy import unfit
from lanes._core.policy.verdicts import never_served
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


# -- never: no candidate could ever serve it -------------------------------------------------------

_CANDIDATES = st.builds(
    Candidate,
    lane=st.sampled_from(["a", "b", "c"]),
    model=st.sampled_from(["m", "n"]),
    tier=st.sampled_from(["local", "free", "paid"]),
    context=st.none() | st.integers(1, 200_000),
    zdr=st.booleans(),
    tools=st.none() | st.booleans(),
    vision=st.none() | st.booleans(),
    json_mode=st.none() | st.booleans(),
)
_PARAMS = st.fixed_dictionaries(
    {},
    optional={
        "max_tokens": st.integers(1, 10**9),
        "tools": st.just([{"type": "function", "function": {"name": "f"}}]),
        "response_format": st.just({"type": "json_object"}),
    },
)


@given(
    st.lists(_CANDIDATES, max_size=6),
    _PARAMS,
    st.sampled_from(["any", "zdr", "local"]),
    st.integers(0, 400_000),
)
def test_never_is_said_exactly_when_no_candidate_fits(candidates, params, privacy, length):
    """A verdict is given when, and only when, every candidate is unfit — and it names a code."""
    job = Job(messages=[{"role": "user", "content": "x" * length}], params=params)
    needs = needs_of(job)
    verdict = never_served(job, candidates, needs, privacy)
    fits = any(unfit(c, needs, privacy) is None for c in candidates)
    assert (verdict is None) == (fits or not candidates)
    if verdict is not None:
        assert verdict.code in ("context_length_exceeded", "no_capable_model")


def test_the_verdict_names_the_numbers():
    """An output cap beyond every context names the tokens asked and the largest context there is;
    the field to change is the cap."""
    job = Job(messages=[{"role": "user", "content": "hi"}], params={"max_tokens": 100_000_000})
    small = Candidate(lane="a", model="m", tier="local", context=8192)
    large = Candidate(lane="b", model="n", tier="paid", context=32768)
    verdict = never_served(job, [small, large], needs_of(job), "any")
    assert verdict is not None and verdict.param == "max_tokens"
    assert verdict.code == "context_length_exceeded"
    assert (
        "needs 100000000 output tokens" in verdict.message and "is 32768 tokens" in verdict.message
    )


#: A local model too small for the request below, and a tool-less one: nothing could serve it.
SMALL = {"models": [{"id": "small", "context": 8192}, {"id": "plain", "tools": False}]}


async def test_an_output_cap_nothing_allows_is_a_400_on_every_door():
    """`max_tokens` = 10⁸: a 400 `invalid_request_error` naming the numbers (code
    `context_length_exceeded`, the cap as its field) on chat, Responses and Messages, plain and
    streamed — never a 503 an SDK would retry — and nothing is sent upstream."""
    async with open_sidecar(("local", "local", ["small"], SMALL)) as (url, fakes):
        got = await answers(url, requests_on_every_door("local/small", max_tokens=100_000_000))
    assert {name: r.status_code for name, r in got.items()} == dict.fromkeys(got, 400)
    assert all("retry-after" not in r.headers for r in got.values())
    for name in ("chat", "chat stream", "responses", "responses stream"):
        error = got[name].json()["error"]
        assert error["type"] == "invalid_request_error"
        assert error["code"] == "context_length_exceeded"
        assert "needs 100000000 output tokens" in error["message"] and "8192" in error["message"]
    assert got["chat"].json()["error"]["param"] == "max_tokens"
    assert got["responses"].json()["error"]["param"] == "max_output_tokens"
    for name in ("messages", "messages stream"):
        assert error_of(got[name]) == (400, "invalid_request_error")
        assert got[name].json()["request_id"] == got[name].headers["request-id"]
    assert fakes["local"].requests() == []


async def test_a_capability_or_privacy_nothing_has_is_a_400():
    """Tools for a tool-less model, `X-Lanes-Privacy: local` for a hosted one, an embedding of a
    chat model: each a 400 `no_capable_model` naming the field, and nothing sent."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    async with (
        open_sidecar(
            ("local", "local", ["small", "plain"], SMALL), ("paid", "paid", ["paid-model"])
        ) as (url, fakes),
        httpx2.AsyncClient(trust_env=False, timeout=10) as http,
    ):
        chat = f"{url}/chat/completions"
        tools = await http.post(
            chat, json={"model": "local/plain", "messages": USER, "tools": [tool]}
        )
        private = await http.post(
            chat,
            json={"model": "paid/paid-model", "messages": USER},
            headers={"x-lanes-privacy": "local"},
        )
        vectors = await http.post(f"{url}/embeddings", json={"model": "local/plain", "input": "x"})
    assert (
        error_of(tools) == (400, "no_capable_model") and tools.json()["error"]["param"] == "tools"
    )
    assert error_of(private) == (400, "no_capable_model")
    assert "X-Lanes-Privacy: local" in private.json()["error"]["message"]
    assert error_of(vectors) == (400, "no_capable_model")
    assert vectors.json()["error"]["param"] == "model"
    assert fakes["local"].requests() == [] and fakes["paid"].requests() == []


async def test_what_only_a_switched_off_free_lane_could_serve_is_not_now():
    """FREE_LANE=off and the job too long for the local model but not for the free one: "not
    now" — a 503 with `Retry-After` — for the free lane may come back on; never a 400."""
    big = {"models": [{"id": "big", "context": 200_000}]}
    async with open_sidecar(
        ("local", "local", ["small"], {"models": [{"id": "small", "context": 8192}]}),
        ("free", "free", ["big"], big),
        env={"FREE_LANE": "off"},
    ) as (url, fakes):
        got = await answers(url, requests_on_every_door("auto", max_tokens=50_000))
    assert {name: r.status_code for name, r in got.items()} == dict.fromkeys(got, 503)
    assert all(r.headers["retry-after"] == "1" for r in got.values())
    assert "free lane off" in got["chat"].json()["error"]["message"]
    assert fakes["local"].requests() == [] and fakes["free"].requests() == []


async def test_a_prompt_every_upstream_says_is_too_long_is_a_400():
    """A model of unknown context whose upstream says the prompt does not fit: a 400
    `context_length_exceeded`, not a 503."""
    too_long = {"error": {"message": "This model's maximum context length is 8192 tokens"}}
    async with open_sidecar(("local", "local", ["local-model"])) as (url, fakes):
        fakes["local"].script("local-model", status(400, too_long))
        got = await answers(url, requests_on_every_door("auto")[:1])
    assert error_of(got["chat"]) == (400, "context_length_exceeded")
    assert "maximum context length is 8192" in got["chat"].json()["error"]["message"]


async def test_a_llamacpp_prompt_past_its_context_is_a_400_in_the_clients_dialect():
    """llama-server's own `exceed_context_size_error` with nothing larger to try: a 400
    `context_length_exceeded` on chat (its message kept) and `invalid_request_error` on Messages —
    not the upstream's bare code "400"."""
    body = json.loads((Path(__file__).parent / "corpus/local/llamacpp-context.json").read_text())
    async with open_sidecar(("local", "local", ["local-model"])) as (url, fakes):
        fakes["local"].script("local-model", status(400, body["body"]))
        doors = requests_on_every_door("auto")
        got = await answers(url, [d for d in doors if d[0] in ("chat", "messages")])
    assert error_of(got["chat"]) == (400, "context_length_exceeded")
    assert "exceeds the available context size (2048" in got["chat"].json()["error"]["message"]
    assert error_of(got["messages"]) == (400, "invalid_request_error")


GONE = {
    "error": {
        "message": "The model `paid-model` does not exist or you do not have access to it.",
        "type": "invalid_request_error",
        "code": "model_not_found",
    }
}


async def test_a_pinned_model_its_upstream_says_does_not_exist_is_a_404():
    """`lane/model` answered 404 `model_not_found`: a 404 `model_not_found` (Messages:
    `not_found_error`), plain and streamed — also while that answer's backoff keeps the model
    from being asked again; `auto` is served by the others meanwhile."""
    async with open_sidecar(
        ("local", "local", ["local-model"]), ("paid", "paid", ["paid-model"])
    ) as (url, fakes):
        fakes["paid"].script("paid-model", status(404, GONE))
        got = await answers(url, requests_on_every_door("paid/paid-model"))
        served = await answers(url, requests_on_every_door("auto")[:1])
    assert {name: r.status_code for name, r in got.items()} == dict.fromkeys(got, 404)
    assert error_of(got["chat"]) == (404, "model_not_found")
    assert error_of(got["responses stream"]) == (404, "model_not_found")
    assert error_of(got["messages"]) == (404, "not_found_error")
    assert "does not exist" in got["chat"].json()["error"]["message"]
    assert len(fakes["paid"].requests()) == 1  # the first; the others wait out its backoff
    assert served["chat"].status_code == 200 and served["chat"].headers["x-lanes-lane"] == "local"


async def test_an_output_cap_beyond_every_models_context_is_a_400_and_lowered_for_a_smaller_one():
    """A cap above a model's `max_output_tokens` is a ceiling: that model is sent the cap it holds;
    a cap no candidate's whole context could ever hold is a 400 naming the largest output any
    allows."""
    caps = {
        "models": [
            {"id": "short", "context": 65536, "max_output_tokens": 4096},
            {"id": "long", "context": 65536, "max_output_tokens": 32768},
        ]
    }
    async with open_sidecar(
        ("local", "local", ["short", "long"], caps), aliases={"both": ["local/short", "local/long"]}
    ) as (url, fakes):
        served = await answers(url, requests_on_every_door("both", max_tokens=8000)[:1])
        refused = await answers(url, requests_on_every_door("both", max_tokens=100_000_000)[:1])
    assert served["chat"].status_code == 200 and served["chat"].headers["x-lanes-model"] == "short"
    error = refused["chat"].json()["error"]
    assert error_of(refused["chat"]) == (400, "context_length_exceeded")
    assert error["message"].startswith(
        "needs 100000000 output tokens (on ~12 of input); the largest context any candidate "
        "allows is 65536 tokens"
    )
    [sent] = fakes["local"].requests()  # the refused one was sent nowhere
    assert sent.model == "short" and sent.body["max_tokens"] == 4096


async def test_a_prompt_no_context_holds_says_prompt_is_too_long_before_anything_is_sent():
    """A prompt longer than every candidate's context is refused before it is sent, in the words
    the Messages API uses ("prompt is too long"), which Claude Code reads as its cue to compact —
    on every door."""
    small = {"models": [{"id": "tiny", "context": 64}]}
    long = [{"role": "user", "content": "word " * 400}]
    async with open_sidecar(("local", "local", ["tiny"], small)) as (url, fakes):
        chat = {"model": "local/tiny", "messages": long}
        messages = {"model": "local/tiny", "messages": long, "max_tokens": 8}
        doors: list[tuple[str, str, dict[str, Any]]] = [
            ("chat", "/chat/completions", chat),
            ("messages", "/messages", messages),
        ]
        refused = await answers(url, doors)
        assert fakes["local"].requests() == []
    for name in ("chat", "messages"):
        status, code = error_of(refused[name])
        assert status == 400 and code in ("context_length_exceeded", "invalid_request_error")
        assert refused[name].json()["error"]["message"].startswith("prompt is too long: it needs ~")


async def test_the_sdks_do_not_retry_what_could_never_be_served():
    """The OpenAI and Anthropic SDKs, left to retry as they do by default, send an impossible
    request once and raise their `BadRequestError`."""
    sent: list[str] = []

    async def count(request: Any) -> None:
        sent.append(request.url.path)

    hooks = {"request": [count]}
    async with open_sidecar(("local", "local", ["small", "plain"], SMALL)) as (url, fakes):
        client = openai.AsyncOpenAI(
            base_url=url, api_key="unused", http_client=httpx2.AsyncClient(event_hooks=hooks)
        )
        with pytest.raises(openai.BadRequestError) as chat:
            await client.chat.completions.create(
                model="local/small", messages=USER, max_tokens=100_000_000
            )
        claude = anthropic.AsyncAnthropic(
            base_url=url.removesuffix("/v1"),
            api_key="unused",
            http_client=httpx2.AsyncClient(event_hooks=hooks),
        )
        with pytest.raises(anthropic.BadRequestError) as messages:
            await claude.messages.create(  # tools: its SDK itself refuses a huge max_tokens
                model="local/plain",
                messages=USER,
                max_tokens=64,
                tools=[{"name": "f", "input_schema": {"type": "object"}}],
            )
    assert sent == ["/v1/chat/completions", "/v1/messages"]
    assert chat.value.code == "context_length_exceeded"
    assert messages.value.request_id == messages.value.response.headers["x-lanes-request-id"]
    assert "calls tools" in messages.value.message and fakes["local"].requests() == []

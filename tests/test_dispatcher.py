"""The dispatcher over real loopback fakes, on virtual time (autojump_clock)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
from conftest import FREE_LANE_OFF

import lanes
from helpers import ENGINE_POLICY, config, free_lane, local_lane, paid_lane
from lanes._core.model.statuses import http_status
from lanes.testing import answer, garbage, hang, open_fake, rate_limited, reset, status

MESSAGES = [{"role": "user", "content": "Say the pangram."}]


def job(**kw) -> lanes.Job:
    return lanes.Job(messages=MESSAGES, **kw)


@pytest.fixture
async def fakes():
    async with (
        open_fake("free", models=("free-model",)) as free,
        open_fake("local", models=("local-model",)) as local,
        open_fake("paid", models=("paid-model",)) as paid,
    ):
        yield free, local, paid


@pytest.mark.free_lane
async def test_free_serves_first(fakes, env, autojump_clock):
    """The first lane in config order answers; nothing is sent to the lanes after it."""
    free, _, paid = fakes
    cfg = config(free_lane("free", free.base_url), paid_lane("paid", paid.base_url))
    async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
        reply = await dispatcher.complete(job(deadline_s=8))
    assert (reply.lane, reply.route, reply.text) == (
        "free",
        "primary",
        "The quick brown fox jumps over the lazy dog.",
    )
    assert reply.cost_usd == 0.0
    assert len(free.requests()) == 1 and paid.requests() == []


async def test_reply_body_is_the_upstreams_own(fakes, env, autojump_clock):
    """The body passes through untouched: the upstream's reported model, fingerprint and usage."""
    _, local, _ = fakes
    local.script("local-model", answer(reported_model="llama3.2:3b-q4"))
    async with lanes.open_dispatcher(
        config(local_lane("local", local.base_url)), env=env
    ) as dispatcher:
        reply = await dispatcher.complete(job(params={"temperature": 0, "seed": 7}))
    assert reply.body["model"] == "llama3.2:3b-q4"
    assert reply.body["system_fingerprint"] == "fp_fake"
    assert reply.model == "local-model" and reply.route == "local"
    assert reply.usage is not None
    assert reply.usage["total_tokens"] == reply.body["usage"]["total_tokens"]


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param(hang(), id="hung"),
        pytest.param(reset(), id="reset"),
        pytest.param(status(503), id="503"),
        pytest.param(status(500), id="500"),
        pytest.param(garbage(), id="garbage"),
        pytest.param(rate_limited(retry_after=30), id="429"),
    ],
)
async def test_failed_free_falls_back_to_paid_inside_the_deadline(
    fault, fakes, env, autojump_clock
):
    """Hung, reset, 5xx, garbage or 429 on the free lane: the paid lane serves before deadline."""
    free, _, paid = fakes
    free.script("free-model", fault)
    cfg = config(
        free_lane("free", free.base_url, attempt_timeout_s=3), paid_lane("paid", paid.base_url)
    )
    async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
        start = trio.current_time()
        reply = await dispatcher.complete(job(deadline_s=8))
        elapsed = trio.current_time() - start
    assert reply.lane == "paid" and reply.route == "paid_fallback"
    assert elapsed <= 3.0 + 1e-6
    assert len(paid.requests()) == 1
    assert reply.cost_usd > 0


async def test_refused_free_falls_back(fakes, env, autojump_clock):
    """A provider whose port refuses connections costs little time: the next lane serves at once
    after one short retry pause (a refusal may be a blip)."""
    free, _, paid = fakes
    await free.refuse()
    cfg = config(free_lane("free", free.base_url), paid_lane("paid", paid.base_url))
    async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
        start = trio.current_time()
        reply = await dispatcher.complete(job(deadline_s=8))
        assert trio.current_time() - start <= 0.5
    assert reply.lane == "paid"
    if not FREE_LANE_OFF:
        assert reply.attempts[0].outcome == "fault" and "ConnectError" in reply.attempts[0].detail


async def test_hung_lane_never_holds_a_job_past_its_deadline(fakes, env, autojump_clock):
    """Every lane hangs: the job ends with DeadlineExceeded exactly at its deadline, not later."""
    _, local, paid = fakes
    local.script("local-model", hang())
    paid.script("paid-model", hang())
    cfg = config(
        local_lane("local", local.base_url, attempt_timeout_s=100),
        paid_lane("paid", paid.base_url, attempt_timeout_s=100),
    )
    async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
        start = trio.current_time()
        with pytest.raises(lanes.DeadlineExceeded) as caught:
            await dispatcher.complete(job(deadline_s=2.5))
        assert trio.current_time() - start == pytest.approx(2.5)
    assert [a.outcome for a in caught.value.attempts] == ["deadline"]
    assert paid.requests() == []  # no time was left to start it
    assert caught.value.skips[0].reason == "too little time left"


async def test_absolute_deadline_is_honoured(fakes, env, autojump_clock):
    """A job carrying `deadline_at` on trio's clock is cut at that instant."""
    _, local, _ = fakes
    local.script("local-model", hang())
    async with lanes.open_dispatcher(
        config(local_lane("local", local.base_url)), env=env
    ) as dispatcher:
        deadline = trio.current_time() + 1.25
        with pytest.raises(lanes.DeadlineExceeded):
            await dispatcher.complete(job(deadline_at=deadline))
        assert trio.current_time() == pytest.approx(deadline)


async def test_lane_given_less_than_min_useful_time_is_skipped(fakes, env, autojump_clock):
    """A lane whose minimum useful time exceeds what is left is skipped without a request."""
    _, local, paid = fakes
    cfg = config(
        local_lane("local", local.base_url, min_useful_s=5), paid_lane("paid", paid.base_url)
    )
    async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
        reply = await dispatcher.complete(job(deadline_s=2))
    assert reply.lane == "paid" and local.requests() == []
    assert reply.skips[0].reason == "too little time left"


@pytest.mark.parametrize("code", [400, 401, 403, 413, 422])
async def test_final_errors_do_not_fall_back(code, fakes, env, autojump_clock):
    """A final upstream error ends the walk: the caller gets it, and the next lane gets nothing."""
    _, local, paid = fakes
    local.script("local-model", status(code))
    cfg = config(local_lane("local", local.base_url), paid_lane("paid", paid.base_url))
    async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
        with pytest.raises(lanes.UpstreamRejected) as caught:
            await dispatcher.complete(job())
        assert dispatcher.statistics().model("local/local-model").breaker.consecutive_faults == 0
    assert caught.value.upstream_status == code and http_status(caught.value) == code
    assert paid.requests() == []


async def test_context_length_error_moves_on(fakes, env, autojump_clock):
    """A 400 saying the prompt does not fit is not final: another candidate is tried."""
    _, local, paid = fakes
    body = {
        "error": {
            "message": "This model's maximum context length is 8192 tokens",
            "code": "context_length_exceeded",
        }
    }
    local.script("local-model", status(400, body))
    cfg = config(local_lane("local", local.base_url), paid_lane("paid", paid.base_url))
    async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
        reply = await dispatcher.complete(job())
    assert reply.lane == "paid"
    assert reply.attempts[0].outcome == "context_length"


#: llama-server's own answer to a prompt past its context (tests/corpus/local/SOURCES.md).
LLAMACPP_TOO_LONG = json.loads(
    (Path(__file__).parent / "corpus" / "local" / "llamacpp-context.json").read_text()
)["body"]


#: llama-server's answer to every request until its model is loaded (tests/corpus/local/SOURCES.md).
LLAMACPP_LOADING = json.loads(
    (Path(__file__).parent / "corpus" / "local" / "llamacpp-loading.json").read_text()
)["body"]


async def test_a_model_still_loading_is_no_fault_against_its_breaker(fakes, env, autojump_clock):
    """llama-server answers 503 "Loading model" until its model is loaded (a restart's 12 s in
    issue 43): each job meanwhile falls back, the lane's breaker counts no fault — a plain 503
    as often opens it (test_breaker_opens_and_skips_without_sending) — and once it is loaded
    the next job is its again."""
    _, local, paid = fakes
    loading = status(503, LLAMACPP_LOADING)
    local.script("local-model", *[loading] * 6, answer(text="loaded"))
    breaker = {"failures": 2, "cooldown_s": 30, "jitter": 0}
    cfg = config(
        local_lane("local", local.base_url, breaker=breaker), paid_lane("paid", paid.base_url)
    )
    async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
        for _ in range(3):
            reply = await dispatcher.complete(job())
            assert reply.lane == "paid"
            assert {(a.outcome, a.category) for a in reply.attempts if a.lane == "local"} == {
                ("rate_limited", "loading")
            }
        stats = dispatcher.statistics().model("local/local-model").breaker
        assert stats.state == "closed" and stats.consecutive_faults == 0
        for _ in range(4):  # the loading answers left, then the model's own
            reply = await dispatcher.complete(job())
    assert reply.text == "loaded" and len(local.requests()) == 7


async def test_a_model_still_loading_with_no_fallback_is_a_503_saying_so(
    fakes, env, autojump_clock
):
    """With nothing to fall back to, the caller hears the upstream's meaning — the model is
    loading, try again (503) — not that free capacity ran out (429)."""
    _, local, _ = fakes
    local.script("local-model", status(503, LLAMACPP_LOADING))
    async with lanes.open_dispatcher(config(local_lane("local", local.base_url)), env=env) as d:
        with pytest.raises(lanes.NoLaneAvailable) as caught:
            await d.complete(job())
    assert not isinstance(caught.value, lanes.FreeTierExhausted)
    assert http_status(caught.value) == 503 and "Loading model" in str(caught.value)


async def test_a_llamacpp_context_overflow_moves_to_a_larger_model(fakes, env, autojump_clock):
    """llama-server's 400 `exceed_context_size_error` (its code a number, its type the word) is a
    context overflow, not a final 400: the next candidate answers and the attempt says so."""
    _, local, paid = fakes
    local.script("local-model", status(400, LLAMACPP_TOO_LONG))
    cfg = config(local_lane("local", local.base_url), paid_lane("paid", paid.base_url))
    async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
        reply = await dispatcher.complete(job())
    assert reply.lane == "paid" and len(paid.requests()) == 1
    assert reply.attempts[0].outcome == "context_length"


async def test_breaker_opens_and_skips_without_sending(fakes, env, autojump_clock):
    """Three consecutive faults open the lane's breaker: the next jobs send it nothing."""
    _, local, paid = fakes
    local.script("local-model", status(503))
    breaker = {"failures": 3, "cooldown_s": 30, "jitter": 0}
    cfg = config(
        local_lane("local", local.base_url, breaker=breaker), paid_lane("paid", paid.base_url)
    )
    async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
        for _ in range(5):
            assert (await dispatcher.complete(job())).lane == "paid"
        stats = dispatcher.statistics().model("local/local-model").breaker
    assert len(local.requests()) == 3
    assert stats.state == "open"


async def test_breaker_half_opens_and_closes_after_recovery(fakes, env, autojump_clock):
    """After the cooldown exactly one probe goes out; when it succeeds the lane serves again."""
    _, local, paid = fakes
    local.script("local-model", status(503), status(503), answer())
    breaker = {"failures": 2, "cooldown_s": 30, "jitter": 0}
    cfg = config(
        local_lane("local", local.base_url, breaker=breaker), paid_lane("paid", paid.base_url)
    )
    async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
        await dispatcher.complete(job())
        await dispatcher.complete(job())
        assert dispatcher.statistics().model("local/local-model").breaker.state == "open"
        await trio.sleep(29)
        assert (await dispatcher.complete(job())).lane == "paid"
        await trio.sleep(1)
        reply = await dispatcher.complete(job())
        assert reply.lane == "local"
        assert dispatcher.statistics().model("local/local-model").breaker.state == "closed"
    assert len(local.requests()) == 3


async def test_probe_cut_by_our_deadline_is_released(fakes, env, autojump_clock):
    """A half-open probe cancelled by the job's deadline does not leave the breaker stuck."""
    _, local, paid = fakes
    local.script("local-model", status(503), hang(), answer())
    breaker = {"failures": 1, "cooldown_s": 10, "jitter": 0}
    cfg = config(local_lane("local", local.base_url, breaker=breaker, attempt_timeout_s=60))
    async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
        with pytest.raises(lanes.NoLaneAvailable):
            await dispatcher.complete(job())
        await trio.sleep(10)
        with pytest.raises(lanes.DeadlineExceeded):
            await dispatcher.complete(job(deadline_s=1))  # the probe hangs; our deadline cuts it
        stats = dispatcher.statistics().model("local/local-model").breaker
        assert stats.state == "half_open" and not stats.probe_in_flight
        reply = await dispatcher.complete(job())  # a fresh probe is allowed at once
    assert reply.lane == "local"


async def test_rate_limits_do_not_count_against_the_breaker(fakes, env, autojump_clock):
    """429 and 402 are free-tier business: ten of them leave the breaker closed."""
    _, local, paid = fakes
    local.script("local-model", rate_limited(retry_after=1), status(402))
    cfg = config(
        local_lane("local", local.base_url, breaker={"failures": 2}),
        paid_lane("paid", paid.base_url),
        policy={**ENGINE_POLICY, "max_wait_s": 0},
    )
    async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
        for _ in range(10):
            await dispatcher.complete(job())
        assert dispatcher.statistics().model("local/local-model").breaker.state == "closed"
    assert len(local.requests()) == 10


async def test_every_lane_failing_is_no_lane_available(fakes, env, autojump_clock):
    """When every lane faults before the deadline the caller gets NoLaneAvailable with each attempt
    and a message naming each candidate's failure. A transient fault is retried on the same
    candidate once per job; the paid one, with its single allowed request, is not retried."""
    _, local, paid = fakes
    local.script("local-model", status(502))
    paid.script("paid-model", reset())
    cfg = config(local_lane("local", local.base_url), paid_lane("paid", paid.base_url))
    async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
        with pytest.raises(lanes.NoLaneAvailable) as caught:
            await dispatcher.complete(job())
    assert [(a.lane, a.outcome, a.retry) for a in caught.value.attempts] == [
        ("local", "fault", False),
        ("local", "fault", True),
        ("paid", "fault", False),
    ]
    assert len(paid.requests()) == 1
    message = str(caught.value)
    assert (
        "local/local-model: HTTP 502" in message
        and "paid/paid-model: ReadError" in message
        and "reset by peer" in message
    )


async def test_model_selection(fakes, env, autojump_clock):
    """`lane/model` pins one candidate, an alias walks its own list, an unknown model is refused."""
    _, local, paid = fakes
    cfg = config(
        local_lane("local", local.base_url),
        paid_lane("paid", paid.base_url),
        aliases={"cheap": ["paid/paid-model", "local/local-model"]},
    )
    async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
        assert (await dispatcher.complete(job(model="paid/paid-model"))).lane == "paid"
        assert (await dispatcher.complete(job(model="cheap"))).lane == "paid"
        assert (await dispatcher.complete(job(model="local-model"))).lane == "local"
        with pytest.raises(lanes.UnknownModel):
            await dispatcher.complete(job(model="gpt-9"))


async def test_runtime_kill_switch(fakes, env, autojump_clock):
    """A lane switched off at runtime is skipped by the next job and returns when switched on."""
    _, local, paid = fakes
    cfg = config(local_lane("local", local.base_url), paid_lane("paid", paid.base_url))
    async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
        dispatcher.lane_off("local")
        assert (await dispatcher.complete(job())).lane == "paid"
        dispatcher.lane_on("local")
        assert (await dispatcher.complete(job())).lane == "local"
        with pytest.raises(KeyError):
            dispatcher.lane_off("nope")
    assert len(local.requests()) == 1


async def test_many_jobs_at_once(fakes, env, autojump_clock):
    """Two hundred concurrent jobs are all served, each under its own deadline."""
    _, local, _ = fakes
    local.script("local-model", answer(delay_s=0.5))
    replies = []
    async with lanes.open_dispatcher(
        config(local_lane("local", local.base_url)), env=env
    ) as dispatcher:

        async def one() -> None:
            replies.append(await dispatcher.complete(job(deadline_s=5)))

        async with trio.open_nursery() as nursery:
            for _ in range(200):
                nursery.start_soon(one)
    assert len(replies) == 200 and all(r.lane == "local" for r in replies)
    assert len(local.requests()) == 200


async def test_request_carries_key_and_params(fakes, env, autojump_clock):
    """The lane sends its key as a bearer token and the caller's params untouched."""
    _, _, paid = fakes
    async with lanes.open_dispatcher(
        config(paid_lane("paid", paid.base_url)), env=env
    ) as dispatcher:
        await dispatcher.complete(job(params={"temperature": 0.2, "tools": [{"type": "function"}]}))
    sent = paid.requests()[0]
    assert sent.authorization
    assert sent.body["temperature"] == 0.2 and sent.body["tools"] == [{"type": "function"}]
    assert sent.body["model"] == "paid-model" and sent.body["messages"] == MESSAGES

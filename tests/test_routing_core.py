"""The routing core's promises over loopback fakes: a sick model never darkens its siblings, the
same-candidate retry never eats the free retry, recovery within 30 s, failures that explain
themselves, and every permit given back on every way out."""

from __future__ import annotations

import contextlib
import sqlite3

import attrs
import pytest
import trio

import lanes
from helpers import (
    PREFILL_PAIR,
    config,
    free_lane,
    http_client,
    local_lane,
    paid_lane,
    sqlite_store,
)
from lanes._core.engine.recovery import Broken, Chunk, Ended, Event, Failed, relay
from lanes.harness.processes import free_port
from lanes.testing import (
    ANSWER,
    answer,
    hang,
    open_fake,
    rate_limited,
    reset,
    status,
    stream_cut,
)
from sidecar import open_sidecar

MESSAGES = [{"role": "user", "content": "Say the pangram."}]
ALLOW = {"free_tier_fallback": "allow", "paid_ceiling_usd_per_day": 100.0}
FAULTS = {"503": lambda: status(503), "reset": reset, "cut": lambda: stream_cut(after=2)}


def job(**kw) -> lanes.Job:
    return lanes.Job(messages=MESSAGES, **kw)


def pair_config(wall, c, *, models=("sick", "ok"), **top):
    """One free lane `wall` with two (or more) models, a paid lane `c`, and the alias `pair`."""
    top.setdefault("policy", ALLOW)
    return config(
        free_lane("wall", wall.base_url, models=list(models)),
        paid_lane("c", c.base_url),
        aliases={"pair": [*(f"wall/{m}" for m in models[:2]), "c/paid-model"]},
        **top,
    )


async def streamed_text(dispatcher: lanes.Dispatcher, job_: lanes.Job) -> tuple[str, list[Event]]:
    """What a streaming client receives, recovery included."""
    events: list[Event] = []

    async def emit(event: Event) -> None:
        events.append(event)

    await relay(dispatcher, job_, emit)
    text = "".join(
        c.data["choices"][0]["delta"].get("content") or ""
        for c in events
        if isinstance(c, Chunk) and c.data.get("choices")
    )
    return text, events


@pytest.mark.free_lane
async def test_a_recovered_stream_is_one_job_with_every_attempt(env, autojump_clock):
    """A stream cut on one model and resumed on its sibling is one job: one entry in the recent
    jobs, one job in the tally, one audit row holding both attempts, and the job's free budget
    spent across the recovery (the resume is its second free attempt)."""
    async with (
        open_fake("wall", models=("sick", "ok")) as wall,
        open_fake("c", models=("paid-model",)) as c,
    ):
        wall.script("sick", stream_cut(after=2))
        async with lanes.open_dispatcher(pair_config(wall, c), env=env) as d:
            text, events = await streamed_text(d, job(model="pair"))
            stats, rows = d.statistics(), d.take_audit_rows()
    assert text == ANSWER and isinstance(events[-1], Ended)
    assert [r["id"] for r in stats.recent] == [events[-1].stream.request_id]
    assert sum(stats.tally.jobs.values()) == 1
    assert len(rows) == 1 and rows[0]["outcome"] == "ok" and rows[0]["attempts"] == 2
    assert [a.route for a in events[-1].stream.attempts] == ["primary", "free_retry"]


async def test_a_recovered_stream_keeps_the_jobs_paid_attempt_budget():
    """`paid_attempts = 1`: "paid requests per job". A paid stream cut mid-answer is resumed on
    another paid model by a fresh walk with fresh budgets: two paid requests for one job."""
    policy = {"free_tier_fallback": "allow", "paid_attempts": 1}
    aliases = {"pp": ["paid/p1", "paid/p2"]}
    async with open_sidecar(
        ("paid", "paid", ["p1", "p2"], PREFILL_PAIR), policy=policy, aliases=aliases
    ) as (url, fakes):
        fakes["paid"].script("p1", stream_cut(after=3))
        async with http_client() as http:
            await http.post(
                f"{url}/chat/completions",
                json={"messages": MESSAGES, "model": "pp", "stream": True},
            )
    assert len(fakes["paid"].requests()) <= 1, [r.model for r in fakes["paid"].requests()]


async def test_an_unbilled_paid_refusal_leaves_the_paid_attempt_for_the_next(env, autojump_clock):
    """`paid_attempts = 1` counts requests that could be billed: a paid 429 (refused before any
    model ran) lets the next paid candidate be asked; a paid 503 (which may be billed) does not."""
    for fault, asked in ((429, {"p1", "p2"}), (503, {"p1"})):
        async with open_fake("c", models=("p1", "p2")) as c:
            c.script("p1", status(fault))
            cfg = config(
                paid_lane("c", c.base_url, models=["p1", "p2"]),
                aliases={"pp": ["c/p1", "c/p2"]},
                policy={**ALLOW, "paid_attempts": 1},
            )
            async with lanes.open_dispatcher(cfg, env=env) as d:
                with contextlib.suppress(lanes.JobFailed):
                    await d.complete(job(model="pp"))
        assert {r.model for r in c.requests()} == asked, fault


async def test_a_paid_request_that_never_connected_costs_nothing_and_counts_nothing(
    env, autojump_clock
):
    """A paid lane whose port refuses connections was never sent the request: the attempt settles
    at $0, and with `paid_attempts = 1` the next paid candidate is still asked."""
    async with open_fake("c2", models=("p2",)) as c2:
        dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
        cfg = config(
            paid_lane("c1", dead, models=["p1"]),
            paid_lane("c2", c2.base_url, models=["p2"]),
            aliases={"pp": ["c1/p1", "c2/p2"]},
            policy={**ALLOW, "paid_attempts": 1},
        )
        async with lanes.open_dispatcher(cfg, env=env) as d:
            reply = await d.complete(job(model="pp"))
            spent = d.paid_spent_today()
    refused = [a for a in reply.attempts if a.lane == "c1"]
    assert reply.lane == "c2" and refused and all(a.category == "connect" for a in refused)
    assert all(a.cost_usd == 0.0 for a in refused)
    assert reply.cost_usd == pytest.approx(spent) and spent > 0


@pytest.mark.free_lane
@pytest.mark.parametrize("fault", sorted(FAULTS))
async def test_a_sick_free_model_is_rescued_by_its_sibling(fault, env, autojump_clock):
    """A persistent 503, a reset or a cut stream on model A is rescued by model B of the same lane,
    with no paid request; A's breaker opens, the lane's and B's stay closed."""
    async with (
        open_fake("wall", models=("sick", "ok")) as wall,
        open_fake("c", models=("paid-model",)) as c,
    ):
        wall.script("sick", FAULTS[fault]())
        async with lanes.open_dispatcher(pair_config(wall, c), env=env) as d:
            for _ in range(8):
                if fault == "cut":
                    text, events = await streamed_text(d, job(model="pair"))
                    assert text == ANSWER and isinstance(events[-1], Ended)
                    assert events[-1].stream.model == "ok"
                else:
                    reply = await d.complete(job(model="pair"))
                    assert (reply.model, reply.cost_usd) == ("ok", 0.0)
            stats = d.statistics()
    assert c.requests() == []
    assert stats.model("wall/sick").breaker.state == "open"
    assert stats.model("wall/ok").free_now and stats.model("wall/ok").breaker.state == "closed"
    assert stats.lane("wall").breaker.state == "closed"
    assert len(wall.requests("sick")) <= 4  # opened after three faults; later jobs skip it unasked


@pytest.mark.free_lane
async def test_the_same_candidate_retry_is_not_the_free_retry(env, autojump_clock):
    """A free primary that faults is retried once on itself, then the other free model serves:
    the retry did not use up the free retry, and nothing was paid."""
    async with (
        open_fake("wall", models=("sick", "ok")) as wall,
        open_fake("c", models=("paid-model",)) as c,
    ):
        wall.script("sick", status(503))
        async with lanes.open_dispatcher(pair_config(wall, c), env=env) as d:
            reply = await d.complete(job(model="pair"))
    assert [(a.model, a.route, a.retry) for a in reply.attempts] == [
        ("sick", "primary", False),
        ("sick", "primary", True),
        ("ok", "free_retry", False),
    ]
    assert (reply.model, reply.route) == ("ok", "free_retry") and c.requests() == []


@pytest.mark.free_lane
async def test_paid_only_when_both_free_models_failed(env, autojump_clock):
    """With consent `allow`, the paid fallback is used only after both free models failed — once,
    with its own reservation, never retried on itself."""
    async with (
        open_fake("wall", models=("sick", "ok")) as wall,
        open_fake("c", models=("paid-model",)) as c,
    ):
        wall.script("sick", status(503))
        wall.script("ok", status(502))
        c.script("paid-model", reset(), answer())
        async with lanes.open_dispatcher(pair_config(wall, c), env=env) as d:
            with pytest.raises(lanes.NoLaneAvailable) as caught:
                await d.complete(job(model="pair"))
            spent = d.paid_spent_today()
            reply = await d.complete(job(model="pair"))  # the paid lane answers this time
            rows = sqlite_store(d).records.query(
                "SELECT COUNT(*), COUNT(DISTINCT id) FROM paid_ledger", ()
            )
    assert [(a.model, a.retry) for a in caught.value.attempts] == [
        ("sick", False),
        ("sick", True),
        ("ok", False),
        ("paid-model", False),
    ]
    assert len(c.requests()) == 2  # one per job: a paid fault is not retried on itself
    assert spent > 0  # the reset paid attempt may have been billed: its reservation stands
    assert reply.lane == "c" and reply.route == "paid_fallback"
    assert rows == [(2, 2)]  # two paid attempts, two reservations


async def test_one_sick_model_does_not_slow_its_four_siblings(env, autojump_clock):
    """A five-model lane where one answers 500 forever keeps serving the other four at full rate."""
    models = ("m1", "m2", "m3", "m4", "m5")
    async with (
        open_fake("wall", models=models) as wall,
        open_fake("c", models=("paid-model",)) as c,
    ):
        wall.script("m1", status(500))
        cfg = config(
            local_lane("wall", wall.base_url, models=list(models)),
            paid_lane("c", c.base_url),
            policy=ALLOW,
        )
        async with lanes.open_dispatcher(cfg, env=env) as d:
            served, failed = 0, 0
            for _ in range(20):
                for model in models:
                    try:
                        reply = await d.complete(job(model=f"wall/{model}"))
                    except lanes.NoLaneAvailable:
                        failed += 1
                    else:
                        served += reply.model != "m1"
            stats = d.statistics()
    assert (served, failed) == (80, 20)
    assert all(len(wall.requests(m)) == 20 for m in models[1:])
    assert (
        len(wall.requests("m1")) <= 8
    )  # three faults open it; then one probe per cooldown at most
    assert stats.lane("wall").breaker.state == "closed"
    assert [m.breaker.state for m in stats.lane("wall").models] == [
        "open",
        "closed",
        "closed",
        "closed",
        "closed",
    ]


@pytest.mark.parametrize("outage_s", [60, 66, 73, 80])
async def test_a_flapping_primary_is_served_again_within_30_s(outage_s, env, autojump_clock):
    """The preferred lane refuses connections for about 60 s, then returns: the fallback serves
    meanwhile, and traffic is back on the preferred lane within 30 s of its recovery (virtual time;
    outages of several lengths end at different phases of the breaker's cooldown schedule)."""
    async with open_fake("a", models=("model-a",)) as a, open_fake("b", models=("model-b",)) as b:
        cfg = config(
            local_lane("a", a.base_url, models=["model-a"]),
            local_lane("b", b.base_url, models=["model-b"]),
            aliases={"pref": ["a/model-a", "b/model-b"]},
            policy=ALLOW,
        )
        async with lanes.open_dispatcher(cfg, env=env) as d:
            start = trio.current_time()
            served: list[tuple[float, str]] = []
            down_at = up_at = None
            while trio.current_time() - start < outage_s + 90:
                elapsed = trio.current_time() - start
                if down_at is None and elapsed >= 10:
                    await a.refuse()
                    down_at = elapsed
                if up_at is None and elapsed >= 10 + outage_s:
                    await a.listen()
                    up_at = elapsed
                reply = await d.complete(job(model="pref", deadline_s=5))
                served.append((trio.current_time() - start, reply.lane))
                await trio.sleep(1.0)
    assert down_at is not None and up_at is not None
    during = [lane for t, lane in served if down_at + 1 < t < up_at]
    assert during and set(during) == {"b"}
    back = next(t for t, lane in served if t > up_at and lane == "a")
    assert back - up_at <= 30.0
    assert all(lane == "a" for t, lane in served if t > back)


@pytest.mark.free_lane
async def test_the_503_names_every_candidate_and_the_request_id_finds_the_audit_row(tmp_path):
    """Nothing could serve: the OpenAI-shaped 503 names each candidate and why; its
    X-Lanes-Request-Id is the job's audit row."""
    import httpx2

    state = tmp_path / "state.db"
    lanes_ = (("wall", "free", ["sick", "ok"]), ("c", "paid", ["paid-model"]))
    async with open_sidecar(
        *lanes_,
        policy={"free_tier_fallback": "off"},
        state=str(state),
        aliases={"pair": ["wall/sick", "wall/ok", "c/paid-model"]},
    ) as (url, fakes):
        fakes["wall"].script("sick", status(503))
        fakes["wall"].script("ok", reset())
        async with httpx2.AsyncClient(trust_env=False) as http:
            response = await http.post(
                f"{url}/chat/completions", json={"model": "pair", "messages": MESSAGES}
            )
            served = await http.post(
                f"{url}/chat/completions", json={"model": "c/paid-model", "messages": MESSAGES}
            )
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "no_lane_available"
    message = error["message"]
    assert "wall/sick: HTTP 503" in message and "wall/ok: ReadError" in message
    assert "c/paid-model: paid fallback off (free_tier_fallback = off)" in message
    request_id = response.headers["x-lanes-request-id"]
    assert served.status_code == 200 and served.headers["x-lanes-request-id"] != request_id
    with sqlite3.connect(state) as db:
        row = db.execute(
            "SELECT outcome, attempts FROM audit WHERE job = ?", (request_id,)
        ).fetchone()
        ok_row = db.execute(
            "SELECT outcome, lane FROM audit WHERE job = ?", (served.headers["x-lanes-request-id"],)
        ).fetchone()
    assert row == ("no_lane_available", 3) and ok_row == ("ok", "c")


# -- every permit back, on every way out -----------------------------------------------------------


async def test_an_unencodable_request_releases_the_half_open_probe(env, autojump_clock):
    """A request JSON can not carry (NaN) fails as a clean 400-class rejection — and the half-open
    probe it held is given back, so the lane serves the next job."""
    async with (
        open_fake("a", models=("model-a",)) as a,
        open_fake("c", models=("paid-model",)),
    ):
        a.script("model-a", status(503), answer())
        breaker = {"failures": 1, "cooldown_s": 10, "jitter": 0}
        cfg = config(local_lane("a", a.base_url, models=["model-a"], breaker=breaker), policy=ALLOW)
        async with lanes.open_dispatcher(cfg, env=env) as d:
            with pytest.raises(lanes.NoLaneAvailable):
                await d.complete(job())
            await trio.sleep(10)  # half-open: the next attempt is the single probe
            with pytest.raises(lanes.UpstreamRejected) as caught:
                await d.complete(job(params={"temperature": float("nan")}))
            state = d.statistics().model("a/model-a").breaker
            reply = await d.complete(job())
    assert caught.value.upstream_status == 400 and "can not be encoded" in str(caught.value)
    assert state.state == "half_open" and not state.probe_in_flight
    assert reply.lane == "a" and len(a.requests()) == 2


async def test_a_stream_abandoned_during_the_probe_releases_it(env, autojump_clock):
    """A streaming client that goes away while its stream is the half-open probe leaves no permit
    held: the breaker is half-open with no probe out, and the next job is served."""
    async with open_fake("a", models=("model-a",)) as a:
        a.script("model-a", status(503), answer(chunk_delay_s=1.0), answer())
        breaker = {"failures": 1, "cooldown_s": 10, "jitter": 0}
        cfg = config(local_lane("a", a.base_url, models=["model-a"], breaker=breaker), policy=ALLOW)
        async with lanes.open_dispatcher(cfg, env=env) as d:
            with pytest.raises(lanes.NoLaneAvailable):
                await d.complete(job())
            await trio.sleep(10)
            with trio.move_on_after(1.5):  # the client leaves mid-stream
                async with d.open_stream(job()) as stream:
                    async for _ in stream:
                        pass
            state = d.statistics().model("a/model-a").breaker
            reply = await d.complete(job())
    assert state.state == "half_open" and not state.probe_in_flight
    assert reply.lane == "a"


async def test_a_cancelled_job_releases_its_permit_and_probe(env, autojump_clock):
    """A job cancelled from outside (its caller gone) while its attempt hangs releases everything,
    and still leaves its audit row."""
    async with open_fake("a", models=("model-a",)) as a:
        a.script("model-a", hang(), answer())
        cfg = config(
            local_lane("a", a.base_url, models=["model-a"], breaker={"failures": 1}), policy=ALLOW
        )
        async with lanes.open_dispatcher(cfg, env=env) as d:
            with trio.move_on_after(2):
                await d.complete(job(deadline_s=20))
            snapshot = d.statistics()
            stats = snapshot.model("a/model-a")
            reply = await d.complete(job())
    assert stats.breaker.state == "closed" and not stats.breaker.probe_in_flight
    assert (snapshot.recent[0]["outcome"], snapshot.recent[0]["attempts"]) == (
        "abandoned",
        1,
    )  # still audited
    assert [a.outcome for a in reply.attempts] == ["ok"]


@pytest.mark.free_lane
async def test_free_now_is_false_when_off_or_broken(env, autojump_clock):
    """`free_now` says no for a lane switched off and for a model whose breaker is open."""
    async with (
        open_fake("wall", models=("sick", "ok")) as wall,
        open_fake("c", models=("paid-model",)) as c,
    ):
        wall.script("sick", status(503))
        async with lanes.open_dispatcher(pair_config(wall, c), env=env) as d:
            for _ in range(2):
                await d.complete(job(model="pair"))
            stats = d.statistics()
            d.lane_off("c")
            off = d.statistics()
    sick = stats.model("wall/sick")
    assert not sick.free_now and sick.reason.startswith("breaker open (since")
    assert stats.model("c/paid-model").free_now and not off.model("c/paid-model").free_now
    assert off.model("c/paid-model").reason == "lane switched off"


async def test_stream_failures_before_the_first_chunk_are_real_errors(env, autojump_clock):
    """Relay: a stream no candidate could start is one `Failed` event carrying the JobFailed."""
    async with open_fake("a", models=("model-a",)) as a:
        a.script("model-a", status(503))
        cfg = config(local_lane("a", a.base_url, models=["model-a"]), policy=ALLOW)
        async with lanes.open_dispatcher(cfg, env=env) as d:
            _, events = await streamed_text(d, job())
    assert len(events) == 1 and isinstance(events[0], Failed)
    assert isinstance(events[0].error, lanes.NoLaneAvailable) and not isinstance(events[0], Broken)


@pytest.mark.free_lane
async def test_jobs_behind_a_cold_models_probe_go_at_its_first_chunk(env, autojump_clock):
    """A free model nothing has proved yet gets one probe while the other jobs wait (single
    flight); they go as soon as its stream's first chunk shows the model serving, not after its
    whole answer (issue 45: 63 of 64 parallel jobs paid one more upstream round trip)."""
    async with open_fake("wall", models=("slow",)) as wall, open_fake("c") as c:
        wall.script("slow", answer(chunk_delay_s=1.0))  # its answer takes ~9 s, chunk by chunk
        cfg = config(free_lane("wall", wall.base_url, models=["slow"]), paid_lane("c", c.base_url))
        async with lanes.open_dispatcher(cfg, env=env) as d:
            ended: list[float] = []

            async def one() -> None:
                text, _ = await streamed_text(d, job(model="wall/slow"))
                assert text == ANSWER
                ended.append(trio.current_time())

            start = trio.current_time()
            async with trio.open_nursery() as nursery:
                for _ in range(8):
                    nursery.start_soon(one)
    sent = [r.at - start for r in wall.requests()]
    assert len(sent) == 8 and c.requests() == []
    assert max(sent) < 2.0, sent  # the waiters went at the probe's first chunk
    assert max(ended) - min(ended) < 2.0  # so all ended within a chunk or two of the probe


async def _eight_at_once(d: lanes.Dispatcher, model: str) -> list[float]:
    """Eight whole-answer jobs to `model` at once: when each ended, from their start."""
    ended: list[float] = []
    start = trio.current_time()

    async def one() -> None:
        with contextlib.suppress(lanes.NoLaneAvailable):
            await d.complete(job(model=model, deadline_s=30))
        ended.append(trio.current_time() - start)

    async with trio.open_nursery() as nursery:
        for _ in range(8):
            nursery.start_soon(one)
    return ended


@pytest.mark.free_lane
async def test_jobs_behind_a_cold_models_whole_answer_go_at_its_quiet_time(env, autojump_clock):
    """A whole answer's headers come only with the answer: the jobs behind a cold model's probe go
    once it has left and the lane's `probe_quiet_s` (0.5 s) passed with no refusal, so 8
    parallel jobs to a model answering after 5 s end by ~5.5 s, not after two answers (issue 45:
    2.03× the upstream's time, measured)."""
    async with open_fake("wall", models=("slow",)) as wall, open_fake("c") as c:
        wall.script("slow", answer(delay_s=5.0))
        lane = free_lane("wall", wall.base_url, models=["slow"], attempt_timeout_s=20)
        cfg = config(lane, paid_lane("c", c.base_url))
        async with lanes.open_dispatcher(cfg, env=env) as d:
            start = trio.current_time()
            ended = await _eight_at_once(d, "wall/slow")
    sent = sorted(r.at - start for r in wall.requests())
    assert len(sent) == 8 and c.requests() == []
    assert sent[0] < 0.1 and all(0.5 <= at < 2.0 for at in sent[1:]), sent
    assert len(ended) == 8 and max(ended) < 6.0, ended


@pytest.mark.free_lane
async def test_a_refusal_within_the_quiet_time_keeps_the_waiters(env, autojump_clock):
    """A probe refused (429) before its quiet time ends holds the others: they see its backoff
    and send nothing (one knock per closed door), even when the refusal took half a second."""
    async with open_fake("wall", models=("m",)) as wall, open_fake("c") as c:
        slow_refusal = attrs.evolve(rate_limited(retry_after=60), delay_s=0.5)
        wall.script("m", slow_refusal)
        lane = free_lane("wall", wall.base_url, models=["m"], probe_quiet_s=1.0)
        async with lanes.open_dispatcher(config(lane, paid_lane("c", c.base_url)), env=env) as d:
            await _eight_at_once(d, "wall/m")
    assert len(wall.requests()) == 1


@pytest.mark.free_lane
async def test_a_quiet_time_as_long_as_first_token_waits_for_the_answer(env, autojump_clock):
    """`probe_quiet_s` set to the lane's `first_token_s`: the others wait for the probe's answer
    itself, as before issue 45."""
    async with open_fake("wall", models=("slow",)) as wall, open_fake("c") as c:
        wall.script("slow", answer(delay_s=3.0))
        lane = free_lane("wall", wall.base_url, models=["slow"], probe_quiet_s=10.0)
        async with lanes.open_dispatcher(config(lane, paid_lane("c", c.base_url)), env=env) as d:
            start = trio.current_time()
            await _eight_at_once(d, "wall/slow")
    sent = sorted(r.at - start for r in wall.requests())
    assert len(sent) == 8 and all(3.0 <= at < 4.5 for at in sent[1:]), sent

"""The free-first policy end to end over loopback fakes: seed 004's outcomes, fallback modes, the
paid ceiling under a burst, retry discipline, governors, privacy and the audit."""

from __future__ import annotations

import sqlite3

import pytest
import trio

import lanes
from helpers import config, free_lane, http_client, local_lane, paid_lane, sqlite_store
from lanes._core.audit.report import report
from lanes._core.model.statuses import http_status
from lanes.testing import ANSWER, answer, hang, open_fake, rate_limited, status
from sidecar import open_sidecar

JOB = [{"role": "user", "content": "Plan my week."}]


def job(**kw) -> lanes.Job:
    return lanes.Job(messages=JOB, **kw)


@pytest.fixture
async def trio_fakes():
    async with (
        open_fake("a", models=("free-a",)) as a,
        open_fake("b", models=("free-b",)) as b,
        open_fake("paid", models=("paid-model",)) as paid,
    ):
        yield a, b, paid


def cfg(a, b, paid, **policy):
    return config(
        free_lane("a", a.base_url, models=["free-a"]),
        free_lane("b", b.base_url, models=["free-b"]),
        paid_lane("paid", paid.base_url),
        policy=policy,
    )


def counts(*fakes):
    return tuple(len(f.requests()) for f in fakes)


# -- seed 004's worked example -------------------------------------------------------------------


@pytest.mark.free_lane
async def test_outcome_one_primary_succeeds(trio_fakes, env, autojump_clock):
    """The free primary answers: one attempt, no paid cost."""
    a, b, paid = trio_fakes
    async with lanes.open_dispatcher(cfg(a, b, paid, free_tier_fallback="allow"), env=env) as d:
        reply = await d.complete(job())
    assert (reply.route, len(reply.attempts), reply.cost_usd) == ("primary", 1, 0.0)
    assert counts(a, b, paid) == (1, 0, 0)


@pytest.mark.free_lane
async def test_outcome_two_free_retry_succeeds(trio_fakes, env, autojump_clock):
    """The primary is rate-limited; the approved free retry answers: two attempts, still free."""
    a, b, paid = trio_fakes
    a.script("free-a", rate_limited(retry_after=30))
    async with lanes.open_dispatcher(cfg(a, b, paid, free_tier_fallback="allow"), env=env) as d:
        reply = await d.complete(job())
    assert (reply.lane, reply.route, len(reply.attempts), reply.cost_usd) == (
        "b",
        "free_retry",
        2,
        0.0,
    )
    assert counts(a, b, paid) == (1, 1, 0)


@pytest.mark.free_lane
async def test_outcome_three_paid_fallback_succeeds(trio_fakes, env, autojump_clock):
    """Both free routes are unavailable; one paid fallback answers: three attempts, a real cost."""
    a, b, paid = trio_fakes
    a.script("free-a", rate_limited(retry_after=30))
    b.script("free-b", rate_limited(retry_after=30))
    async with lanes.open_dispatcher(cfg(a, b, paid, free_tier_fallback="allow"), env=env) as d:
        reply = await d.complete(job())
        spent = d.paid_spent_today()
    assert (reply.lane, reply.route, len(reply.attempts)) == ("paid", "paid_fallback", 3)
    assert reply.cost_usd > 0 and spent == pytest.approx(reply.cost_usd)
    assert counts(a, b, paid) == (1, 1, 1)
    assert paid.requests()[0].body["max_tokens"] == 4096  # the reservation's worst case, made true


@pytest.mark.free_lane
async def test_outcome_four_paid_ceiling_reached(trio_fakes, env, autojump_clock):
    """Paid breaker's budget spent: the router fails in a controlled way and buys nothing."""
    a, b, paid = trio_fakes
    a.script("free-a", rate_limited(retry_after=30))
    b.script("free-b", rate_limited(retry_after=30))
    async with lanes.open_dispatcher(
        cfg(a, b, paid, free_tier_fallback="allow", paid_ceiling_usd_per_day=0.001), env=env
    ) as d:
        with pytest.raises(lanes.PaidBudgetExhausted) as caught:
            await d.complete(job())
    assert http_status(caught.value) == 429 and caught.value.code == "paid_budget_exhausted"
    assert len(caught.value.attempts) == 2 and counts(a, b, paid) == (1, 1, 0)


# -- fallback modes ---------------------------------------------------------------------------


async def free_gone(a, b):
    a.script("free-a", rate_limited(retry_after=30))
    b.script("free-b", rate_limited(retry_after=40))


@pytest.mark.free_lane
async def test_mode_off_fails_with_the_exact_wait(trio_fakes, env, autojump_clock):
    """off: no paid request; FreeTierExhausted names the soonest free candidate and its wait."""
    a, b, paid = trio_fakes
    await free_gone(a, b)
    async with lanes.open_dispatcher(cfg(a, b, paid), env=env) as d:
        with pytest.raises(lanes.FreeTierExhausted) as caught:
            await d.complete(job())
    wait = caught.value.retry_after_s
    assert caught.value.next_eligible == "a/free-a" and wait is not None and 29 <= wait <= 33.05
    assert counts(a, b, paid) == (1, 1, 0)


async def test_mode_allow_pays_without_asking(trio_fakes, env, autojump_clock):
    a, b, paid = trio_fakes
    await free_gone(a, b)
    async with lanes.open_dispatcher(cfg(a, b, paid, free_tier_fallback="allow"), env=env) as d:
        assert (await d.complete(job())).route == "paid_fallback"


@pytest.mark.free_lane
async def test_mode_ask_approve_once(trio_fakes, env, autojump_clock):
    """ask: the job waits; approving once lets it through; the next job asks again."""
    a, b, paid = trio_fakes
    await free_gone(a, b)
    async with lanes.open_dispatcher(cfg(a, b, paid, free_tier_fallback="ask"), env=env) as d:
        async with trio.open_nursery() as nursery:
            box = {}

            async def run() -> None:
                box["reply"] = await d.complete(job(client="alice", deadline_s=30))

            nursery.start_soon(run)
            await trio.sleep(1)
            [pending] = d.approvals.pending()
            assert (pending.client, pending.candidate) == ("alice", "paid/paid-model")
            assert (
                set(pending.exhausted) == {"a/free-a", "b/free-b"}
                and pending.estimated_cost_usd > 0
            )
            await d.approvals.decide(pending.id, "once")
        assert box["reply"].route == "paid_fallback"
        with pytest.raises(lanes.FallbackNeedsApproval) as caught:
            await d.complete(job(client="alice", deadline_s=2))
    assert http_status(caught.value) == 429 and caught.value.approval_id.startswith("ap-")
    assert len(paid.requests()) == 1


async def test_mode_ask_deny(trio_fakes, env, autojump_clock):
    a, b, paid = trio_fakes
    await free_gone(a, b)
    async with (
        lanes.open_dispatcher(cfg(a, b, paid, free_tier_fallback="ask"), env=env) as d,
        trio.open_nursery() as nursery,
    ):
        errors = []

        async def run() -> None:
            try:
                await d.complete(job(client="bob"))
            except lanes.FallbackDenied as exc:
                errors.append(exc)

        nursery.start_soon(run)
        await trio.sleep(1)
        await d.approvals.decide(d.approvals.pending()[0].id, "deny")
    assert len(errors) == 1 and paid.requests() == []


async def test_mode_ask_time_grant_is_per_client_and_persisted(
    trio_fakes, env, tmp_path, autojump_clock
):
    """Approving for an hour lets the client's later jobs through without asking — even after a
    restart — while another client is still asked."""
    a, b, paid = trio_fakes
    await free_gone(a, b)
    conf = cfg(a, b, paid, free_tier_fallback="ask")
    conf = lanes.load_config(
        {
            "lanes": [lane_table(lane) for lane in conf.lanes],
            "state": str(tmp_path / "s.db"),
            "policy": {"free_tier_fallback": "ask"},
        },
        env={},
    )
    async with lanes.open_dispatcher(conf, env=env) as d, trio.open_nursery() as nursery:
        nursery.start_soon(d.complete, job(client="carol"))
        await trio.sleep(1)
        await d.approvals.decide(d.approvals.pending()[0].id, 3600.0)
    async with lanes.open_dispatcher(conf, env=env) as d:
        reply = await d.complete(job(client="carol", deadline_s=2))
        with pytest.raises(lanes.FallbackNeedsApproval):
            await d.complete(job(client="dave", deadline_s=2))
    assert reply.route == "paid_fallback" and len(paid.requests()) == 2


def lane_table(lane):
    import cattrs

    return cattrs.Converter().unstructure(lane)


async def test_pinned_paid_model_needs_no_fallback_consent(trio_fakes, env, autojump_clock):
    """Naming a paid model is consent; the ceiling still applies."""
    a, b, paid = trio_fakes
    async with lanes.open_dispatcher(cfg(a, b, paid), env=env) as d:
        reply = await d.complete(job(model="paid/paid-model"))
    assert reply.lane == "paid" and counts(a, b, paid) == (0, 0, 1)


# -- the hard ceiling under a burst ---------------------------------------------------------------


async def test_two_hundred_jobs_spend_exactly_the_ceiling(env, autojump_clock):
    """200 jobs forced into paid fallback with a ceiling worth 10: 10 served, the rest refused, and
    the money spent is exactly the ceiling, never a cent more."""
    async with open_fake("paid", models=("paid-model",)) as paid:
        completion_tokens = len(ANSWER) // 4  # what the fake reports
        price = 2.0  # USD per million output tokens; input free, so worst case == real cost
        per_job = completion_tokens * price / 1e6
        lane_cfg = paid_lane("paid", paid.base_url)
        lane_cfg["models"] = [
            {"id": "paid-model", "input_usd_per_mtok": 0.0, "output_usd_per_mtok": price}
        ]
        conf = config(
            lane_cfg,
            policy={"free_tier_fallback": "allow", "paid_ceiling_usd_per_day": per_job * 10},
        )
        served, refused = [], []
        async with lanes.open_dispatcher(conf, env=env) as d:

            async def one() -> None:
                try:
                    served.append(await d.complete(job(params={"max_tokens": completion_tokens})))
                except lanes.PaidBudgetExhausted:
                    refused.append(1)

            async with trio.open_nursery() as nursery:
                for _ in range(200):
                    nursery.start_soon(one)
            spent = d.paid_spent_today()
    assert (len(served), len(refused)) == (10, 190)
    assert len(paid.requests()) == 10
    assert spent == pytest.approx(per_job * 10) and spent <= per_job * 10 + 1e-12


async def test_ledger_that_can_not_be_written_fails_closed(
    trio_fakes, env, autojump_clock, monkeypatch
):
    """If the store can not record the reservation, no paid attempt is made."""
    a, b, paid = trio_fakes
    await free_gone(a, b)
    async with lanes.open_dispatcher(cfg(a, b, paid, free_tier_fallback="allow"), env=env) as d:

        def broken(*args, **kw):
            raise sqlite3.OperationalError("disk I/O error")

        monkeypatch.setattr(d.store, "reserve", broken)
        with pytest.raises(lanes.PaidBudgetExhausted, match="can not be written"):
            await d.complete(job())
    assert paid.requests() == []


async def test_crash_before_settling_never_undercounts(env, tmp_path, autojump_clock):
    """A reservation never settled (the process died mid-attempt) stays counted in full."""
    async with open_fake("paid", models=("paid-model",)) as paid:
        paid.script("paid-model", hang())
        conf = config(
            paid_lane("paid", paid.base_url),
            state=str(tmp_path / "s.db"),
            policy={"free_tier_fallback": "allow", "paid_ceiling_usd_per_day": 1.0},
        )
        async with lanes.open_dispatcher(conf, env=env) as d:
            with trio.move_on_after(1):  # the "crash": the job is abandoned mid-attempt
                await d.complete(job(params={"max_tokens": 10}))
        async with lanes.open_dispatcher(conf, env=env) as d:
            assert d.paid_spent_today() > 0


# -- retry discipline ---------------------------------------------------------------------------


@pytest.mark.free_lane
async def test_transient_fault_is_retried_once_on_the_same_candidate(
    trio_fakes, env, autojump_clock
):
    """A 503 blip is retried on the same free model after a short pause, and it answers."""
    a, b, paid = trio_fakes
    a.script("free-a", status(503), answer())
    async with lanes.open_dispatcher(cfg(a, b, paid), env=env) as d:
        reply = await d.complete(job())
    assert reply.lane == "a" and [x.outcome for x in reply.attempts] == ["fault", "ok"]
    times = [r.at for r in a.requests()]
    assert 0.25 <= times[1] - times[0] <= 0.5
    assert counts(a, b, paid) == (2, 0, 0)


@pytest.mark.free_lane
async def test_short_429_is_waited_out_when_the_alternative_costs_money(env, autojump_clock):
    """Only a paid lane is left: a 429 asking for 2 s is waited out and the free model answers."""
    async with (
        open_fake("a", models=("free-a",)) as a,
        open_fake("paid", models=("paid-model",)) as paid,
    ):
        a.script("free-a", rate_limited(retry_after=2), answer())
        conf = config(
            free_lane("a", a.base_url, models=["free-a"]),
            paid_lane("paid", paid.base_url),
            policy={"free_tier_fallback": "allow"},
        )
        async with lanes.open_dispatcher(conf, env=env) as d:
            start = trio.current_time()
            reply = await d.complete(job())
            waited = trio.current_time() - start
    assert reply.lane == "a" and paid.requests() == []
    assert 2.0 <= waited <= 2.3  # never earlier than asked


@pytest.mark.free_lane
async def test_short_429_moves_on_when_another_free_candidate_exists(
    trio_fakes, env, autojump_clock
):
    a, b, paid = trio_fakes
    a.script("free-a", rate_limited(retry_after=2), answer())
    async with lanes.open_dispatcher(cfg(a, b, paid), env=env) as d:
        start = trio.current_time()
        reply = await d.complete(job())
        assert trio.current_time() - start < 0.1
    assert reply.lane == "b" and counts(a, b, paid) == (1, 1, 0)


@pytest.mark.free_lane
async def test_silent_candidate_is_not_tried_again(env, autojump_clock):
    """A hung local model is cut at its cap and not retried within the job."""
    async with (
        open_fake("local", models=("local-model",)) as local,
        open_fake("a", models=("free-a",)) as a,
    ):
        local.script("local-model", hang())
        conf = config(
            local_lane("local", local.base_url, attempt_timeout_s=2),
            free_lane("a", a.base_url, models=["free-a"]),
            policy={},
        )
        async with lanes.open_dispatcher(conf, env=env) as d:
            reply = await d.complete(job(deadline_s=20))
    assert reply.lane == "a" and len(local.requests()) == 1


@pytest.mark.free_lane
async def test_attempt_cap_per_job(trio_fakes, env, autojump_clock):
    """max_attempts bounds every attempt of a job, retries included."""
    a, b, paid = trio_fakes
    a.script("free-a", status(503))
    b.script("free-b", status(503))
    async with lanes.open_dispatcher(
        cfg(a, b, paid, free_tier_fallback="allow", max_attempts=2), env=env
    ) as d:
        with pytest.raises(lanes.NoLaneAvailable) as caught:
            await d.complete(job())
    assert len(caught.value.attempts) == 2 and counts(a, b, paid) == (2, 0, 0)


@pytest.mark.free_lane
async def test_governor_changes_behaviour(trio_fakes, env, autojump_clock):
    """With 3 attempts a minute, the fourth job fails with its own error and the exact wait."""
    a, b, paid = trio_fakes
    async with lanes.open_dispatcher(cfg(a, b, paid, attempts_per_minute=3), env=env) as d:
        for _ in range(3):
            await d.complete(job())
        with pytest.raises(lanes.GovernorExhausted) as caught:
            await d.complete(job())
    wait = caught.value.retry_after_s
    assert wait is not None and 0 < wait <= 60 and counts(a, b, paid) == (3, 0, 0)


async def test_private_job_is_never_rescued_by_a_hosted_lane(env, autojump_clock):
    """privacy=local: when the owned lane fails, the job fails — no hosted lane sees the prompt."""
    async with (
        open_fake("local", models=("local-model",)) as local,
        open_fake("a", models=("free-a",)) as a,
        open_fake("paid", models=("paid-model",)) as paid,
    ):
        local.script("local-model", status(503))
        conf = config(
            local_lane("local", local.base_url),
            free_lane("a", a.base_url, models=["free-a"]),
            paid_lane("paid", paid.base_url),
            policy={"free_tier_fallback": "allow"},
        )
        async with lanes.open_dispatcher(conf, env=env) as d:
            with pytest.raises(lanes.NoLaneAvailable):
                await d.complete(job(privacy="local"))
    assert counts(a, paid) == (0, 0)


# -- the audit ------------------------------------------------------------------------------------


@pytest.mark.free_lane
async def test_audit_of_a_burst_answers_seed_004s_questions(
    trio_fakes, env, tmp_path, autojump_clock
):
    """Forty jobs across cohorts with the primary failing now and then: every job is audited, no
    body is kept, and the queries give the expected figures."""
    a, b, paid = trio_fakes
    a.script("free-a", *([answer()] * 5 + [rate_limited(retry_after=1)]) * 6, answer())
    state = str(tmp_path / "audit.db")
    conf = config(
        free_lane("a", a.base_url, models=["free-a"]),
        free_lane("b", b.base_url, models=["free-b"]),
        paid_lane("paid", paid.base_url),
        state=state,
        policy={"free_tier_fallback": "allow"},
    )
    async with lanes.open_dispatcher(conf, env=env) as d:
        for i in range(40):
            await d.complete(job(cohort="ads" if i % 2 else "organic", request_class="general"))
            await trio.sleep(2)
        query = sqlite_store(d).records.query
        await trio.sleep(1)  # one sync: the audit rows reach the store
        rows = query("SELECT COUNT(*), SUM(body != ''), SUM(request_bytes > 0) FROM audit", ())
        by_class = report(query, since=0.0, by="class", ceiling_usd=1.0)
        by_cohort = report(query, since=0.0, by="cohort", ceiling_usd=1.0)
        text = " ".join(str(v) for row in query("SELECT * FROM audit", ()) for v in row)
    assert rows == [(40, 0, 40)]
    failed_primaries = len([r for r in a.requests() if r.behaviour == "status"])
    assert failed_primaries > 0
    [general] = by_class.groups
    total = by_class.total
    assert general.key == "general"
    assert general.primary_free_success == pytest.approx((40 - failed_primaries) / 40)
    assert total.free_retry_rate == pytest.approx(failed_primaries / 40)
    assert total.free_retry_reasons == {"rate_limited": failed_primaries}
    assert total.paid_jobs == 0 and total.paid_cost_usd == 0
    cohorts = {g.key: g for g in by_cohort.groups}
    assert set(cohorts) == {"ads", "organic"} and sum(c.jobs for c in cohorts.values()) == 40
    assert total.attempts_per_answer == pytest.approx(1 + failed_primaries / 40)
    assert set(total.latency_s_by_route) == {"primary", "free_retry"}
    assert total.errors == {"rate_limited": failed_primaries}
    assert total.requests == len(a.requests()) + len(b.requests())  # one row per upstream request
    assert "Plan my week" not in text


async def test_a_clients_own_key_does_not_use_up_the_shared_attempt_governor():
    """ "It never counts against the shared quotas": a client calling its bring-your-own-key lane
    uses up the global `attempts_per_minute` governor, and every other client gets 429."""
    byok = ("mine", "free", ["own"], {"byok": True, "free_tier": {"kind": "rate_limited"}})
    policy = {"free_tier_fallback": "off", "attempts_per_minute": 2}
    async with (
        open_sidecar(byok, ("local", "local", ["local-model"]), policy=policy) as (url, _),
        http_client() as http,
    ):
        own = [
            await http.post(
                f"{url}/chat/completions",
                json={"messages": JOB, "model": "mine/own"},
                headers={"x-lanes-key-mine": "sk-mine-0123456789abcdef"},
            )
            for _ in range(2)
        ]
        shared = await http.post(
            f"{url}/chat/completions", json={"messages": JOB, "model": "local/local-model"}
        )
    assert [r.headers.get("x-lanes-route") for r in own] == ["byok", "byok"]
    assert shared.status_code == 200, shared.text

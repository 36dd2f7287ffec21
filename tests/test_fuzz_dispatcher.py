"""Fuzz: hostile upstream answers driven through the dispatcher (Hypothesis, deterministic)."""

from __future__ import annotations

import trio
from fuzz import (
    EVENT_CAP,
    MAX_TOKENS,
    POLICY,
    SMALL_CAP,
    Answer,
    billed_usd,
    json_answers,
    stream_answers,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trio.testing import MockClock

import lanes
from helpers import PAID_KEY, config, examples, paid_lane
from lanes._core.freetier.prices import usage_cost
from lanes._core.model.errors import StreamInterrupted
from lanes._core.model.statuses import http_status
from lanes._http.errors import job_failed
from lanes.testing import answer, open_fake

MESSAGES = [{"role": "user", "content": "Say the pangram, in full, please."}]
GOOD_USAGE = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}


def hostile_config(sick_url: str, good_url: str, **top):
    return config(
        paid_lane(
            "sick",
            sick_url,
            ["sick-model"],
            max_response_bytes=SMALL_CAP,
            max_event_bytes=EVENT_CAP,
            attempt_timeout_s=2,
            first_token_s=2,
            idle_s=1,
        ),
        paid_lane("good", good_url, ["good-model"]),
        policy=POLICY,
        **top,
    )


async def _scenario(answers: list[Answer], streamed: list[bool]) -> None:
    async with open_fake("sick") as sick, open_fake("good") as good:
        sick.script("sick-model", *[a.behaviour for a in answers])
        good.script("good-model", answer(usage=GOOD_USAGE))
        env = {"PAID_API_KEY": PAID_KEY}
        async with lanes.open_dispatcher(
            hostile_config(sick.base_url, good.base_url), env=env
        ) as d:
            for stream in streamed:
                job = lanes.Job(messages=MESSAGES, params={"max_tokens": MAX_TOKENS}, deadline_s=20)
                try:
                    if stream:
                        async with d.open_stream(job) as reply:
                            async for _ in reply:
                                pass
                    else:
                        await d.complete(job)
                except lanes.JobFailed as exc:
                    status, body, _ = job_failed(exc)
                    assert status == http_status(exc) or status == 502
                    assert set(body["error"]) >= {"message", "type", "code", "param"}
                    assert status < 500 or isinstance(exc, StreamInterrupted), (status, exc)
            stats = d.statistics()
            spent = d.paid_spent_today()
    for lane in stats.lanes:
        assert not lane.breaker.probe_in_flight, lane
        assert not any(m.breaker.probe_in_flight for m in lane.models), lane
    assert stats.background.failing == {}
    sent = [(answers[min(i, len(answers) - 1)], True) for i in range(len(sick.requests()))]
    billed = billed_usd(sent) + len(good.requests()) * (usage_cost(GOOD_USAGE, 1.0, 2.0) or 0.0)
    assert spent >= 0.0 and spent >= billed - 1e-12, (spent, billed)


@settings(
    max_examples=examples(60),
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    answers=st.lists(st.one_of(json_answers(), stream_answers()), min_size=1, max_size=3),
    streamed=st.lists(st.booleans(), min_size=1, max_size=3),
)
def test_hostile_upstreams_never_break_the_dispatcher(answers, streamed):
    """Any mix of statuses, headers, bodies, streams and usage values from one upstream, a healthy
    one behind it: every job is served or fails as the upstream's fault (never a 5xx of ours),
    every error is OpenAI-shaped, no breaker is left with a probe out, the background tasks are
    well, and the paid ledger is never negative nor below what the upstreams billed."""
    trio.run(_scenario, answers, streamed, clock=MockClock(autojump_threshold=0))

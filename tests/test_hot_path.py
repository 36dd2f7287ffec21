"""The hot path does less per request and loses nothing: a finished job's audit row, recent entry
and totals are folded off the reply's path, yet every reader sees every finished job; the roll-ups
summed in batches equal the roll-ups written row by row; a plain stream chunk's one-pass check
agrees with the full rewriting path."""

from __future__ import annotations

import contextlib
import copy
import datetime
import sqlite3

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lanes
from helpers import config, examples, local_lane
from lanes._core.audit import journal
from lanes._core.freetier import headers, prices
from lanes._core.model.candidates import Candidate
from lanes._core.model.job import digest
from lanes._core.policy.needs import Needs
from lanes._core.policy.policy import fit
from lanes._core.policy.ranking import Ranking
from lanes._core.policy.scoring import ScoringConfig, score
from lanes._core.state import audit_tables
from lanes._core.upstream.bodies import _chunk_shaped, _plain_chunk
from lanes._core.upstream.shapes import ToolIndexes, normal_chunk
from lanes.testing import open_fake

MESSAGES = [{"role": "user", "content": "Say the pangram."}]


@contextlib.asynccontextmanager
async def local_dispatcher(env, **top):
    """A dispatcher over one local lane on a loopback fake (so the test runs with FREE_LANE=off)."""
    async with (
        open_fake("local", models=("local-model",)) as local,
        lanes.open_dispatcher(config(local_lane("local", local.base_url), **top), env=env) as d,
    ):
        yield d


# -- a stream chunk: the one-pass check against the full path ------------------------------------

_text = st.text(max_size=4)
_content = st.one_of(
    st.none(),
    _text,
    st.integers(),
    st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": _text}), max_size=2),
)
_delta = st.one_of(
    st.none(),
    st.integers(),
    st.fixed_dictionaries(
        {},
        optional={
            "content": _content,
            "role": st.just("assistant"),
            "tool_calls": st.one_of(
                st.none(),
                st.lists(st.fixed_dictionaries({"id": _text}), max_size=2),
            ),
        },
    ),
)
_choice = st.one_of(
    st.integers(),
    st.fixed_dictionaries(
        {},
        optional={
            "index": st.integers(0, 2),
            "delta": _delta,
            "finish_reason": st.one_of(st.none(), st.sampled_from(["", "stop", "length"])),
        },
    ),
)
_chunk = st.one_of(
    st.lists(st.integers(), max_size=1),
    st.fixed_dictionaries(
        {},
        optional={
            "choices": st.one_of(st.none(), _text, st.lists(_choice, max_size=3)),
            "usage": st.just({"prompt_tokens": 1}),
        },
    ),
)


@settings(max_examples=examples(400), deadline=None)
@given(_chunk)
def test_a_chunk_the_one_pass_check_calls_plain_needs_nothing_of_the_full_path(chunk):
    plain, finish = _plain_chunk(chunk)
    if not plain:
        assert finish is None
        return
    # the full path would rewrite nothing, refuse nothing, and see the same finish reason
    assert normal_chunk(chunk) is None
    assert ToolIndexes().indexed(chunk) is None
    assert _chunk_shaped(chunk)
    seen = None
    for choice in chunk.get("choices") or ():
        if isinstance(choice.get("finish_reason"), str) and choice["finish_reason"]:
            seen = choice["finish_reason"]
    assert finish == seen


def test_text_deltas_and_a_finish_are_plain_and_typed_parts_or_tool_calls_are_not():
    text = {"choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}]}
    assert _plain_chunk(text) == (True, None)
    assert _plain_chunk({"choices": [{"delta": {}, "finish_reason": "stop"}]}) == (True, "stop")
    assert _plain_chunk({"choices": [], "usage": {"prompt_tokens": 3}}) == (True, None)
    parts = {"choices": [{"delta": {"content": [{"type": "text", "text": "Hi"}]}}]}
    calls = {"choices": [{"delta": {"tool_calls": [{"id": "c1"}]}}]}
    assert _plain_chunk(parts) == (False, None) and normal_chunk(parts) is not None
    assert _plain_chunk(calls) == (False, None)


# -- the roll-ups: summed per batch, equal to row by row -----------------------------------------

_attempt = st.fixed_dictionaries(
    {
        "lane": st.sampled_from(["a", "b"]),
        "model": st.sampled_from(["m", "n"]),
        "route": st.sampled_from(["primary", "free_retry", "paid_fallback"]),
        "outcome": st.sampled_from(["ok", "fault"]),
        "category": st.sampled_from(["", "5xx"]),
        "latency_s": st.floats(0, 5),
    }
)
_row = st.fixed_dictionaries(
    {
        "at": st.floats(0, 3 * 3600),
        "client": st.sampled_from(["anonymous", "ci", "x\x1fy"]),
        "cohort": st.sampled_from(["", "eval"]),
        "class": st.sampled_from(["general", "long"]),
        "lane": st.sampled_from(["", "a", "b"]),
        "model": st.sampled_from(["", "m"]),
        "route": st.sampled_from(["", "primary", "paid_fallback"]),
        "tier": st.sampled_from(["", "free", "paid"]),
        "outcome": st.sampled_from(["ok", "deadline"]),
        "privacy": st.just("any"),
        "zdr": st.sampled_from([0, 1]),
        "first_free_outcome": st.sampled_from(["", "ok", "fault"]),
        "free_attempts": st.integers(0, 3),
        "attempts": st.integers(0, 3),
        "cost_usd": st.floats(0, 0.01),
        "attempts_made": st.lists(_attempt, max_size=3),
    }
)


def _rollups(rows, *, one_by_one: bool):
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.executescript(audit_tables.SCHEMA)
    for batch in ([row] for row in rows) if one_by_one else [rows]:
        audit_tables.write(conn, batch)
    jobs = conn.execute("SELECT * FROM audit_jobs_hourly ORDER BY 1, 2, 3, 4, 5, 6, 7, 8, 9, 10")
    attempts = conn.execute("SELECT * FROM audit_attempts_hourly ORDER BY 1, 2, 3, 4, 5, 6")
    return jobs.fetchall(), attempts.fetchall()


def _rounded(table):
    return [tuple(round(v, 9) if isinstance(v, float) else v for v in row) for row in table]


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(_row, max_size=12))
def test_the_rollups_summed_per_batch_equal_the_rollups_written_row_by_row(drawn):
    rows = []
    for n, d in enumerate(drawn):
        row = {k: v for k, v in d.items() if k != "attempts_made"}
        row["job"] = f"j{n}"
        row["attempt_rows"] = [
            {**a, "job": f"j{n}", "n": i, "at": d["at"], "client": d["client"]}
            | {"cohort": d["cohort"], "class": d["class"]}
            for i, a in enumerate(d["attempts_made"])
        ]
        rows.append(row)
    batched, single = _rollups(rows, one_by_one=False), _rollups(rows, one_by_one=True)
    assert [_rounded(t) for t in batched] == [_rounded(t) for t in single]


# -- the journal: folded off the reply's path, never missing from a reader -----------------------


async def test_a_finished_job_is_in_every_reader_before_any_sync(env, autojump_clock):
    async with local_dispatcher(env) as d:
        replies = [await d.complete(lanes.Job(messages=MESSAGES)) for _ in range(3)]
        recent = d.statistics().recent
        assert [r["id"] for r in recent] == [r.request_id for r in reversed(replies)]
        assert sum(d.statistics().tally.jobs.values()) == 3
        rows = d.take_audit_rows()
    assert [row["job"] for row in rows] == [r.request_id for r in replies]
    sha, size = digest(replies[0].body["choices"])
    assert rows[0]["answer_sha256"] == sha and rows[0]["answer_bytes"] == size
    assert all(row["outcome"] == "ok" and row["route"] == "local" for row in rows)


async def test_finished_jobs_are_folded_at_once_when_too_many_wait(
    env, autojump_clock, monkeypatch
):
    """Each waiting end holds its job's request: no more than `MAX_ENDED` of them wait, whether or
    not anything reads."""
    monkeypatch.setattr(journal, "MAX_ENDED", 4)
    async with local_dispatcher(env) as d:
        waiting = []
        for _ in range(10):
            await d.complete(lanes.Job(messages=MESSAGES))
            waiting.append(len(d._journal._ended))
        assert max(waiting) < 4 and waiting[3] == 0  # the fourth end folded all four
        assert len(d.take_audit_rows()) == 10


@pytest.mark.parametrize("log_bodies", [False, True])
async def test_the_answer_is_kept_only_for_log_bodies(env, autojump_clock, log_bodies):
    async with local_dispatcher(env, log_bodies=log_bodies) as d:
        reply = await d.complete(lanes.Job(messages=MESSAGES))
        (ended,) = d._journal._ended
        assert (ended.answer is not None) is log_bodies
        (row,) = d.take_audit_rows()
    assert bool(row["body"]) is log_bodies
    if log_bodies:
        assert reply.body["choices"][0]["message"]["content"] in row["body"]


async def test_a_job_whose_row_can_not_be_built_costs_no_other_job_its_row(env, autojump_clock):
    """A library caller's message holding a value JSON can not write (a date) with bodies logged:
    that job's row is dropped and counted, the jobs around it keep theirs."""
    messages = [{"role": "user", "content": "Say the pangram.", "x": datetime.date(2026, 12, 2)}]
    async with local_dispatcher(env, log_bodies=True) as d:
        first = await d.complete(lanes.Job(messages=MESSAGES))
        with pytest.raises(lanes.JobFailed):  # nor can it be sent: JSON can not write it
            await d.complete(lanes.Job(messages=messages))
        last = await d.complete(lanes.Job(messages=MESSAGES))
        stats = d.statistics()
        rows = d.take_audit_rows()
    assert [row["job"] for row in rows] == [first.request_id, last.request_id]
    assert [r["id"] for r in stats.recent] == [last.request_id, first.request_id]
    assert sum(stats.tally.jobs.values()) == 2
    assert stats.background.dropped.get("audit rows") == 1


async def test_a_waiting_end_holds_no_message_and_no_key(env, autojump_clock):
    secret = "sk-test-" + "k" * 24
    async with local_dispatcher(env) as d:
        await d.complete(lanes.Job(messages=MESSAGES, keys={"local": secret}))
        (ended,) = d._journal._ended
        assert "pangram" not in repr(ended) and secret not in repr(ended)
        assert ended.job.request() is None and ended.job.fingerprint()[1] > 0


# -- the rate-limit headers and the usage: the quick ways agree with the careful ones ------------

_names = st.sampled_from(
    ["X-RateLimit-Remaining-Requests", "x-ratelimit-limit-tokens", "Retry-After", " date ", "A"]
)
_values = st.one_of(st.text(max_size=6), st.binary(max_size=3), st.none(), st.integers())


@settings(max_examples=examples(300), deadline=None)
@given(st.dictionaries(st.one_of(_names, st.binary(max_size=3)), _values, max_size=6))
def test_headers_as_a_dict_normalise_as_the_same_pairs_do(given_headers):
    assert headers._normalise(given_headers) == headers._normalise(list(given_headers.items()))


_count = st.one_of(st.integers(-2, 50), st.none(), st.text(max_size=2))
_usage = st.one_of(
    st.none(),
    st.integers(),
    st.fixed_dictionaries(
        {},
        optional={"prompt_tokens": _count, "completion_tokens": _count, "total_tokens": _count},
    ),
)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(_usage, min_size=1, max_size=4), st.lists(st.integers(0, 3), max_size=8))
def test_reading_the_same_usage_again_reads_what_reading_it_afresh_does(usages, order):
    for i in [*order, *range(len(usages))]:
        usage = usages[i % len(usages)]
        assert prices.usage_tokens(usage) == prices.usage_tokens(copy.deepcopy(usage))
        read = prices._read_usage_of(usage)
        assert prices._read_usage(usage) == read


# -- the ranking: a score kept from the last time equals the score worked out afresh -------------

_CANDIDATES = [Candidate(lane=lane, model=m, tier="free") for lane in ("a", "b") for m in "xy"]
_step = st.tuples(
    st.sampled_from(["note", "score"]),
    st.integers(0, len(_CANDIDATES) - 1),
    st.sampled_from(["ok", "fault", "deadline", "rate_limited", "abandoned"]),
    st.floats(0, 10),
    st.floats(0, 2000),
    st.booleans(),
)


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(_step, max_size=30))
def test_a_score_kept_from_before_is_the_score_worked_out_afresh(steps):
    ranking, now = Ranking(ScoringConfig()), 1_000.0
    for kind, i, outcome, latency_s, later, tools in steps:
        now += later
        if kind == "note":
            ranking.note(_CANDIDATES[i], outcome, latency_s, now)
            continue
        needs = Needs(tools=tools, tokens=int(latency_s * 1000))
        degraded = ranking.degraded()
        got = ranking.scores(_CANDIDATES, needs, now, degraded=degraded)
        for c in _CANDIDATES:
            context, capability = fit(c, needs)
            fresh = score(
                ranking.stats.get(c.key),
                now=now,
                config=ranking.config,
                degraded=c.lane in degraded,
                context_fit=context,
                capability_fit=capability,
            )
            assert got[c.key] == fresh


def _front_as_it_was(ranking, ordered, job, scores, now, healthy):
    """`Ranking.front` before it looked at one candidate's health first (its code then)."""
    from lanes._core.policy.ranking import _to_front
    from lanes._core.policy.scoring import Stats, pick_exploration

    ordered = list(ordered)
    free = [c for c in ordered if c.tier == "free" and healthy(c)]
    if not free:
        return ordered, None, False
    remembered = ranking.remembered(job, now)
    if remembered:
        chosen = next((c for c in free if c.key == remembered), None)
        if chosen is not None:
            return _to_front(ordered, free[0], chosen), None, True
    ranked = [(c.key, scores.get(c.key, 0.0), ranking.stats.get(c.key, Stats()).n) for c in free]
    pick = pick_exploration(ranked, ranking.config, ranking.rng.random())
    if pick is None:
        return ordered, None, False
    ranking.explored += 1
    chosen = next(c for c in free if c.key == pick)
    return _to_front(ordered, free[0], chosen), pick, False


_plan_member = st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from("xyz"))


@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(
        st.tuples(_plan_member, st.sampled_from(["local", "free", "paid"]), st.booleans()),
        max_size=8,
        unique_by=lambda m: m[0],
    ),
    st.floats(0, 1),
    st.integers(0, 2**32),
    st.booleans(),
)
def test_the_front_looks_at_less_and_answers_as_it_did(members, rate, seed, conversation):
    import random

    ordered = [Candidate(lane=lane, model=m, tier=tier) for (lane, m), tier, _ in members]
    sick = {c.key for c, (_, _, ok) in zip(ordered, members, strict=True) if not ok}
    scores = {c.key: (hash(c.key) % 100) / 100 for c in ordered}
    messages = [{"role": "user", "content": "hi"}]
    if conversation:
        messages += [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "?"}]
    job = lanes.Job(messages=messages)
    both = []
    for _ in range(2):
        ranking = Ranking(ScoringConfig(explore_rate=rate, explore_gap=1.0), random.Random(seed))
        if conversation and ordered:
            ranking.remember(job, ordered[-1].key, 0.0)
        both.append(ranking)
    new = both[0].front(ordered, job, scores, 1.0, lambda c: c.key not in sick)
    old = _front_as_it_was(both[1], ordered, job, scores, 1.0, lambda c: c.key not in sick)
    assert new == old
    assert both[0].rng.random() == both[1].rng.random()  # the same draws taken
    assert both[0].explored == both[1].explored

"""A large discovered catalog (issue 28, Why 9): a job's routing cost does not grow with the models
that can not serve it, the plan drawn lazily is exactly the sorted plan, and a lane keeps at most
`max_models` discovered models."""

from __future__ import annotations

from typing import Any

import httpx2
import openai
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

import lanes
from helpers import config, free_lane, local_lane
from lanes._core.engine.gate import Gate
from lanes._core.engine.order import _record_removed
from lanes._core.model.candidates import Candidate
from lanes._core.model.clocks import TrioTime
from lanes._core.model.record import MAX_SKIPS, JobRecord
from lanes._core.policy import ranking, scoring
from lanes._core.policy.autoplan import AutoPlan
from lanes._core.policy.needs import needs_of
from lanes._core.policy.plan_queue import Queue
from lanes._core.policy.policy import PolicyConfig, make_plan
from lanes._core.policy.pool import Pool
from lanes._http.server import serve
from lanes.harness.configs import KEYS
from lanes.testing import open_fake, status

JOB = [{"role": "user", "content": "hi"}]
BIG = 10_000


# -- the lazy plan is the sorted plan --------------------------------------------------------------

candidate_shapes = st.tuples(
    st.sampled_from(["a", "b", "c"]),
    st.sampled_from(["local", "byok", "free", "free", "paid"]),
    st.sampled_from([None, 100, 50_000]),
    st.sampled_from([None, True, False]),
    st.sampled_from([None, True, False]),
    st.booleans(),
    st.booleans(),
)


def _candidates(shapes: list[tuple[Any, ...]]) -> list[Candidate]:
    first: dict[str, str] = {}  # a bring-your-own-key lane is one whole (as a loaded one is)
    out = []
    for i, (lane, tier, context, tools, json_mode, zdr, prefill) in enumerate(shapes):
        if first.setdefault(lane, tier) == "byok":
            tier = "byok"
        elif tier == "byok":
            tier = "free"
        out.append(
            Candidate(
                lane=lane,
                model=f"m{i}",
                tier=tier,
                context=context,
                tools=tools,
                json_mode=json_mode,
                zdr=zdr,
                prefill=prefill,
            )
        )
    return out


def _cold(c: Candidate) -> float:
    """A score that depends only on what a group shares (as the ranking's does)."""
    return ((c.context or 7) % 5) / 10 + (0.01 if c.tools else 0.0) + ord(c.lane) / 1000


@given(
    shapes=st.lists(candidate_shapes, min_size=0, max_size=30),
    tools=st.booleans(),
    privacy=st.sampled_from(["any", "zdr", "local"]),
    byok_key=st.booleans(),
    free_tier_only=st.booleans(),
    data=st.data(),
)
def test_the_lazy_plan_is_make_plans_order(shapes, tools, privacy, byok_key, free_tier_only, data):
    """Drawn lazily from the pool's groups, an `auto` plan is exactly `make_plan`'s: the same
    candidates in the same order (tier, class preference, score, config order), the same removed
    with the same reasons; dropping a lane midway leaves the rest in order."""
    candidates = _candidates(shapes)
    keys = [c.key for c in candidates]
    free_keys = [c.key for c in candidates if c.tier == "free"]
    some_free = st.sampled_from(free_keys or ["x/none"])  # (a key no candidate has: ignored)
    some = st.sampled_from(keys or ["x/none"])
    warm = data.draw(st.dictionaries(some_free, st.floats(0, 1), max_size=5))
    preferred = data.draw(st.lists(some, unique=True, max_size=4))
    excluded = set(data.draw(st.lists(some, max_size=3)))
    job = lanes.Job(
        messages=JOB,
        privacy=privacy,
        keys={"a": "k", "b": "k", "c": "k"} if byok_key else {},
        params={"tools": [{"type": "function", "function": {"name": "f"}}]} if tools else {},
    )
    policy = PolicyConfig(
        free_tier_only=free_tier_only, classes={"agentic": preferred, "general": preferred}
    )
    needs = needs_of(job)
    kept = [c for c in candidates if c.key not in excluded]
    scores = {c.key: warm.get(c.key, _cold(c)) for c in kept if c.tier == "free"}
    expected = make_plan(job, kept, policy, scores=scores, needs=needs)

    def plan() -> AutoPlan:
        return AutoPlan(
            Pool(candidates, {}),
            job,
            policy,
            needs=needs,
            keep=lambda c: c.key not in excluded,
            warm=lambda: warm,
            cold=_cold,
        )

    drawn = plan()
    queue = Queue(drawn)
    order = [queue.pop().key for _ in iter(lambda: bool(queue), False)]
    assert order == [c.key for c in expected.candidates]
    assert (drawn.request_class, drawn.privacy) == (expected.request_class, expected.privacy)
    record = JobRecord(job, deadline_at=TrioTime(10.0), started_at=TrioTime(0.0))
    _record_removed(record, drawn.removed, needs, drawn.privacy)
    removed_all = make_plan(job, candidates, policy, scores=scores, needs=needs).removed
    assert [(s.lane, s.model, s.reason) for s in record.skips] == [
        (s.lane, s.model, s.reason) for s in removed_all
    ]
    if order:
        cut = data.draw(st.integers(0, len(order) - 1))
        dropped = expected.candidates[cut]
        queue = Queue(plan())
        head = [queue.pop().key for _ in range(cut)]
        rest_of_lane = list(queue.drop_lane(dropped.lane, dropped.tier))
        tail = [queue.pop().key for _ in iter(lambda: bool(queue), False)]
        later = list(expected.candidates[cut:])
        gone = [c.key for c in later if (c.lane, c.tier) == (dropped.lane, dropped.tier)]
        assert head == order[:cut]
        assert sorted(c.key for c in rest_of_lane) == sorted(gone)
        assert tail == [c.key for c in later if c.key not in gone]


def test_a_record_lists_a_bounded_number_of_skips():
    """Past `MAX_SKIPS` a record counts skips instead of listing them, and says how many."""
    record = JobRecord(
        lanes.Job(messages=JOB), deadline_at=TrioTime(10.0), started_at=TrioTime(0.0)
    )
    for i in range(MAX_SKIPS + 500):
        record.skip(Candidate(lane="big", model=f"m{i}", tier="free"), "backoff")
    assert len(record.skips) == MAX_SKIPS and record.skips_more == 500
    assert record.all_skips()[-1].reason == "500 more, not listed"
    assert record.reasons().endswith("and 500 more candidates passed over")


# -- over fakes: what one job costs beside a catalog of 10,000 -------------------------------------


class Counted:
    """How many scores and gate checks the jobs cost."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.scored = self.checked = 0
        score, refusal, admit = scoring.score, Gate.refusal, Gate.admit

        def counted_score(*args, **kw):
            self.scored += 1
            return score(*args, **kw)

        def counted_refusal(gate, candidate):
            self.checked += 1
            return refusal(gate, candidate)

        async def counted_admit(gate, candidate, record):
            self.checked += 1
            return await admit(gate, candidate, record)

        monkeypatch.setattr(ranking, "score", counted_score)
        monkeypatch.setattr(Gate, "refusal", counted_refusal)
        monkeypatch.setattr(Gate, "admit", counted_admit)

    def reset(self) -> None:
        self.scored = self.checked = 0


def big_lane(url: str, **extra: Any) -> dict[str, Any]:
    return {**free_lane("big", url, discover=True), "models": [], "max_models": BIG, **extra}


async def loaded(dispatcher: lanes.Dispatcher, n: int) -> None:
    with trio.fail_after(60):
        while len(dispatcher.lanes["big"].candidates) < n:  # noqa: ASYNC110 - a background fetch
            await trio.sleep(0.1)


@pytest.mark.free_lane
async def test_a_local_job_costs_nothing_of_a_large_catalog(env, autojump_clock, monkeypatch):
    """A local lane serves every `auto` job: beside a discovered free lane of 10,000 models, a job
    scores at most one group of them and checks at most a look-ahead's worth at the gate."""
    counted = Counted(monkeypatch)
    async with open_fake("local", models=("local-model",)) as local, open_fake("big") as big:
        big.catalog = [{"id": f"vendor/m{i}:free"} for i in range(BIG)]
        cfg = config(local_lane("local", local.base_url), big_lane(big.base_url))
        async with lanes.open_dispatcher(cfg, env=env) as d:
            await loaded(d, BIG)
            await d.complete(lanes.Job(messages=JOB))  # the first job warms the local lane
            counted.reset()
            replies = [await d.complete(lanes.Job(messages=JOB)) for _ in range(5)]
    assert {r.lane for r in replies} == {"local"}
    assert counted.scored <= 5 * 1, counted.scored  # one group of 10,000 alike models, per job
    assert counted.checked <= 5 * 20, counted.checked


@pytest.mark.free_lane
async def test_a_free_job_costs_what_it_reaches(env, autojump_clock, monkeypatch):
    """With no local lane, the 10,000 free models serve: each job scores the group and the few
    with outcomes of their own, and records a bounded plan."""
    counted = Counted(monkeypatch)
    async with open_fake("big") as big:
        big.catalog = [{"id": f"vendor/m{i}:free"} for i in range(BIG)]
        async with lanes.open_dispatcher(config(big_lane(big.base_url)), env=env) as d:
            await loaded(d, BIG)
            await d.complete(lanes.Job(messages=JOB))
            counted.reset()
            replies = [await d.complete(lanes.Job(messages=JOB)) for _ in range(5)]
            await trio.sleep(2)  # the audit rows reach the store
            plans = [p for (p,) in d.store.records.query("SELECT plan FROM audit", ())]
    assert {r.lane for r in replies} == {"big"}
    assert counted.scored <= 5 * 3, counted.scored
    assert counted.checked <= 5 * 20, counted.checked
    assert max(len(p) for p in plans) < 1000  # the plan's first 16, not 10,000 keys


@pytest.mark.free_lane
async def test_a_lane_switched_off_is_passed_over_whole(env, autojump_clock, monkeypatch):
    """10,000 models of a lane switched off: the walk turns the first away at the gate and passes
    over the rest at once; the error names the lane once and stays short."""
    counted = Counted(monkeypatch)
    async with open_fake("local", models=("local-model",)) as local, open_fake("big") as big:
        local.script("local-model", status(500))
        big.catalog = [{"id": f"vendor/m{i}:free"} for i in range(BIG)]
        cfg = config(local_lane("local", local.base_url), big_lane(big.base_url))
        async with lanes.open_dispatcher(cfg, env=env) as d:
            await loaded(d, BIG)
            d.lane_off("big")
            counted.reset()
            with pytest.raises(lanes.JobFailed) as failed:
                await d.complete(lanes.Job(messages=JOB))
    message = str(failed.value)
    assert "big/*: lane switched off" in message and len(message) < 8000
    assert len(failed.value.skips) <= MAX_SKIPS
    assert counted.checked <= 100, counted.checked  # (10,000 and more before)


@pytest.mark.free_lane
async def test_discovery_keeps_at_most_max_models(env, autojump_clock, caplog_lanes):
    """A catalog of 10,000 free models: the lane keeps `max_models` (1000 by default), in the
    list's order, and says so in one warning naming the lane and the numbers — not again when a
    refresh finds the same."""
    async with open_fake("big") as big:
        big.catalog = [{"id": f"vendor/m{i}:free"} for i in range(BIG)]
        lane = {**free_lane("big", big.base_url, discover=True), "models": []}
        async with lanes.open_dispatcher(config(lane), env=env) as d:
            await loaded(d, 1000)
            await trio.sleep(1)
            models = [c.model for c in d.lanes["big"].candidates]
            await d.catalog.refresh_catalogs(trio.current_time() + 30)
            kept_records = len(d.lanes["big"].catalog)
    assert models == [f"vendor/m{i}:free" for i in range(1000)]
    assert kept_records == 1000  # the records of the models left out are not kept either
    lines = [r.getMessage() for r in caplog_lanes.records if "max_models" in r.getMessage()]
    assert lines == [
        "lane big: the catalog lists 10000 routable models; keeping 1000 "
        "(lanes.big.max_models = 1000), leaving out 9000"
    ]


def test_max_models_must_be_positive():
    """`max_models = 0` is refused, naming the key."""
    with pytest.raises(lanes.ConfigError, match="max_models"):
        config({**free_lane("big", "http://127.0.0.1:9", discover=True), "max_models": 0})


# -- the views stay bounded ------------------------------------------------------------------------


@pytest.mark.free_lane
async def test_the_views_do_not_grow_with_the_catalog():
    """A discovered lane of 10,000 models: `/v1/lanes` (which the page polls every second) shows 50
    of them (the used ones first, then the list's first) and sums up the rest as `other`;
    `/metrics` stays small; `/v1/models` pages by `limit`/`after` and its pages add up to the
    whole list, which the openai SDK's `models.list()` still reads entire."""
    async with open_fake("big") as big, trio.open_nursery() as nursery:
        big.catalog = [{"id": f"vendor/m{i}:free"} for i in range(BIG)]
        cfg = config(big_lane(big.base_url), server={"port": 0})
        url = await nursery.start(lambda task_status: serve(cfg, env=KEYS, task_status=task_status))
        async with httpx2.AsyncClient(base_url=url, trust_env=False, timeout=60) as http:
            with trio.fail_after(60):
                while True:
                    state = (await http.get("/v1/lanes")).json()
                    if state["lanes"][0]["other"]:
                        break
                    await trio.sleep(0.1)
            late = "big/vendor/m9999:free"  # a model far down the list, used: it is shown
            await http.post("/v1/chat/completions", json={"model": late, "messages": JOB})
            lanes_bytes = len((await http.get("/v1/lanes")).content)
            state = (await http.get("/v1/lanes")).json()
            metrics = (await http.get("/metrics")).text
            whole = (await http.get("/v1/models")).json()
            pages, params = [], {"limit": "1000"}
            while True:
                page = (await http.get("/v1/models", params=params)).json()
                pages.append(page)
                if not page["has_more"]:
                    break
                params = {"limit": "1000", "after": page["last_id"]}
            bad = await http.get("/v1/models", params={"after": "no/such"})
            too_many = await http.get("/v1/models", params={"limit": "1001"})
        sdk = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        listed = [m.id async for m in sdk.models.list()]
        await sdk.close()
        nursery.cancel_scope.cancel()
    lane = state["lanes"][0]
    assert len(lane["models"]) == 50 and lane["other"] == {"models": BIG - 50, "free_now": BIG - 50}
    shown = {m["model"]: m["used_today"] for m in lane["models"]}
    assert shown["vendor/m9999:free"] == 1 and "vendor/m0:free" in shown
    assert lanes_bytes < 64_000 and len(metrics) < 64_000, (lanes_bytes, len(metrics))
    assert 'lanes_lane_models{lane="big",state="routable"} 10000.0' in metrics
    ids = [m["id"] for page in pages for m in page["data"]]
    assert len(pages) == 11 and ids == [m["id"] for m in whole["data"]] and len(ids) == BIG + 1
    assert listed == ids and whole["has_more"] is False
    assert (bad.status_code, bad.json()["error"]["param"]) == (400, "after")
    assert (too_many.status_code, too_many.json()["error"]["param"]) == (400, "limit")

"""Provider catalogs, free detection, ranking, exploration, sticky routing and refresh."""

from __future__ import annotations

import random
import types

import httpx2
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

import lanes
from helpers import config, free_lane
from lanes._core.freetier.kinds import FreeModelsOnly, NoFreeTier, RateLimitedFree, tier_of
from lanes._core.model.errors import FinalError, ModelLoading, RetryableError
from lanes._core.policy import ranking
from lanes._core.policy.scoring import (
    ScoringConfig,
    Stats,
    degraded_providers,
    reliability,
    score,
    wilson_lower,
)
from lanes._core.upkeep import next_round_s
from lanes._core.upstream.catalog import ModelRecord, declared_free, normalise
from lanes.testing import answer, open_fake, rate_limited, status

# -- recorded-shape catalogs -----------------------------------------------------------------------

PER_TOKEN = {
    "data": [
        {
            "id": "meta-llama/llama-3.3-70b-instruct:free",
            "context_length": 131072,
            "pricing": {"prompt": "0", "completion": "0"},
            "supported_parameters": ["tools", "response_format"],
            "architecture": {"input_modalities": ["text"]},
        },
        {
            "id": "vendor/zero-priced",
            "context_length": 8192,
            "pricing": {"prompt": "0", "completion": "0"},
        },
        {
            "id": "anthropic/claude-sonnet",
            "context_length": 200000,
            "pricing": {"prompt": "0.000003", "completion": "0.000015"},
            "architecture": {"input_modalities": ["text", "image"]},
        },
        {"id": "vendor/unpriced"},
        {"id": "vendor/odd:free", "pricing": {"prompt": "x"}},
        {"no_id": True},
        "junk",
    ]
}
PER_MTOK = [
    {
        "id": "meta-llama/Llama-3.3-70B-Instruct-Turbo-Free",
        "type": "chat",
        "context_length": 131072,
        "pricing": {"input": 0, "output": 0},
    },
    {"id": "some/embedding", "type": "embedding"},
    {
        "id": "meta-llama/Llama-3-8b-chat-hf",
        "type": "chat",
        "pricing": {"input": 0.2, "output": 0.2},
    },
]
OPENAI_STYLE = {
    "object": "list",
    "data": [{"id": "llama-3.1-8b-instant", "context_window": 131072}],
}
PREFIXED = {"data": [{"id": "models/gemini-2.5-flash"}]}


def test_normalise_each_shape():
    """Each shape reads into one record type; entries without an id, or neither chat nor
    embedding, are skipped; an embedding model is marked as one."""
    per_token = {r.id: r for r in normalise("per_token_prices", PER_TOKEN)}
    assert set(per_token) == {
        "meta-llama/llama-3.3-70b-instruct:free",
        "vendor/zero-priced",
        "anthropic/claude-sonnet",
        "vendor/unpriced",
        "vendor/odd:free",
    }
    llama = per_token["meta-llama/llama-3.3-70b-instruct:free"]
    assert (llama.context, llama.tools, llama.json_mode, llama.vision) == (
        131072,
        True,
        True,
        False,
    )
    assert per_token["anthropic/claude-sonnet"].input_usd_per_mtok == pytest.approx(3.0)
    assert per_token["anthropic/claude-sonnet"].vision is True
    assert [(r.id, r.embedding) for r in normalise("per_mtok_prices", PER_MTOK)] == [
        ("meta-llama/Llama-3.3-70B-Instruct-Turbo-Free", False),
        ("some/embedding", True),
        ("meta-llama/Llama-3-8b-chat-hf", False),
    ]
    assert normalise("openai", OPENAI_STYLE)[0].context == 131072
    assert normalise("prefixed_ids", PREFIXED)[0].id == "gemini-2.5-flash"


@pytest.mark.parametrize(
    ("model", "kind", "expected_tier"),
    [
        (
            "meta-llama/llama-3.3-70b-instruct:free",
            FreeModelsOnly(),
            "free",
        ),  # :free suffix and zero price
        (
            "vendor/zero-priced",
            FreeModelsOnly(),
            "free",
        ),  # zero price on a paid provider, no suffix
        ("anthropic/claude-sonnet", FreeModelsOnly(), "paid"),  # priced
        ("vendor/unpriced", FreeModelsOnly(), "paid"),  # unknown price is not free
        (
            "vendor/odd:free",
            FreeModelsOnly(),
            "free",
        ),  # the kind covers the name, whatever the junk price
        ("vendor/zero-priced", NoFreeTier(), "paid"),  # a provider with no free tier stays paid
        ("vendor/unpriced", RateLimitedFree(), "free"),  # the kind covers the whole provider
        ("anthropic/claude-sonnet", RateLimitedFree(), "paid"),  # a listed price says paid
    ],
)
def test_free_detection_table(model, kind, expected_tier):
    """Free only when the provider says so; an unknown price is not free."""
    record = {r.id: r for r in normalise("per_token_prices", PER_TOKEN)}[model]
    assert tier_of(kind, model, declared_free(record, kind)) == expected_tier


def test_ids_that_can_not_travel_are_skipped_and_embeddings_marked():
    """An id with a newline, a space, a control character or over 256 characters is skipped (it
    would break a header); an embedding model is marked by its type, its output or its name."""
    document = {
        "data": [
            {"id": "ok-model"},
            {"id": "evil\r\nX-Injected: 1"},
            {"id": "has space"},
            {"id": "nul\x00"},
            {"id": "x" * 257},
            {"id": "text-embedding-3-small"},
            {"id": "vendor/vec", "architecture": {"output_modalities": ["embeddings"]}},
            {"id": "odd", "architecture": "not a mapping"},
        ]
    }
    records = {r.id: r.embedding for r in normalise("openai", document)}
    assert records == {
        "ok-model": False,
        "text-embedding-3-small": True,
        "vendor/vec": True,
        "odd": False,
    }


def test_ids_that_hold_a_key_are_not_listed():
    """A catalog id holding the lane's key (in any shape) or anything key-shaped is left out: a
    model id is shown on every page, metric and story; ordinary ids stay."""
    key = "3f0c9a52-1b7e-4d8a-9c61-0e5b2f7d4a19"  # shaped like a UUID: known only by value
    ids = [
        "ok-model",
        "gpt-4o-mini-2024-07-18",
        f"echo-{key}",
        "vendor/sk-Qw6uaDWi6tBowjQsfAriwMMtNdEIi5Ef",
        "b7Q2xK9mN4pL8vR3tY6wZ1cF5hJ0dS2a",
    ]
    document = {"data": [{"id": i} for i in ids]}
    assert [r.id for r in normalise("openai", document, (key,))] == ids[:2]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda c: (
        st.lists(c, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "id",
                    "data",
                    "pricing",
                    "prompt",
                    "completion",
                    "context_length",
                    "type",
                    "supported_parameters",
                    "architecture",
                ]
            )
            | st.text(max_size=4),
            c,
            max_size=5,
        )
    ),
    max_leaves=15,
)


@given(
    st.sampled_from(["openai", "per_token_prices", "per_mtok_prices", "prefixed_ids"]), json_values
)
def test_normalise_never_raises(style, document):
    """Any document yields a list of records, never an exception."""
    assert all(isinstance(r, ModelRecord) for r in normalise(style, document))


# -- reliability and penalties ---------------------------------------------------------------------

CONFIG = ScoringConfig()


def test_one_for_one_can_not_outrank_two_hundred_for_two_hundred_and_five():
    assert reliability(1, 1, CONFIG) < reliability(200, 205, CONFIG)
    assert reliability(0, 0, CONFIG) == 0.5


@given(st.integers(0, 300), st.integers(1, 300))
def test_reliability_is_bounded_and_monotone(successes, n):
    """In [0, 1]; one more success never lowers it; from min_samples on, below the observed rate."""
    successes = min(successes, n)
    value = reliability(successes, n, CONFIG)
    assert 0.0 <= value <= 1.0
    if successes < n:
        assert reliability(successes + 1, n, CONFIG) >= value
    if n >= CONFIG.min_samples:
        assert value <= successes / n + 1e-12
        assert value == wilson_lower(successes, n)


def test_penalties_decay_by_half_life():
    """A 429 costs its full penalty now and half of it one half-life later."""
    stats = Stats()
    stats.count("rate_limited", 0.0, now=1000.0)
    assert stats.penalty(1000.0, CONFIG) == pytest.approx(0.05)
    assert stats.penalty(1000.0 + CONFIG.half_life_s, CONFIG) == pytest.approx(0.025)
    assert score(stats, now=1000.0 + 10 * CONFIG.half_life_s, config=CONFIG) > score(
        stats, now=1000.0, config=CONFIG
    )


def test_degraded_provider_multiplies_its_models_down():
    """A provider failing most of its recent outcomes is degraded and ranks lower."""
    from collections import deque

    recent = {"bad": deque([False] * 4 + [True], maxlen=20), "good": deque([True] * 5, maxlen=20)}
    assert degraded_providers(recent, CONFIG) == {"bad"}
    stats = Stats()
    for _ in range(10):
        stats.count("ok", 0.1, now=0.0)
    assert score(stats, now=0.0, config=CONFIG, degraded=True) < score(
        stats, now=0.0, config=CONFIG
    )


# -- over fakes ------------------------------------------------------------------------------------

JOB = [{"role": "user", "content": "hi"}]


@pytest.mark.free_lane
async def test_exploration_rate_within_tolerance(env, autojump_clock, monkeypatch):
    """With explore_rate 0.2 about a fifth of 500 jobs go to the runner-up, marked as explored."""
    async with open_fake("a", models=("m",)) as a, open_fake("b", models=("m",)) as b:
        cfg = config(
            free_lane("a", a.base_url, ["m"]),
            free_lane("b", b.base_url, ["m"]),
            scoring={"explore_rate": 0.2},
        )
        seeded = types.SimpleNamespace(Random=lambda: random.Random(42))  # the draw, repeatable
        monkeypatch.setattr(ranking, "random", seeded)
        async with lanes.open_dispatcher(cfg, env=env) as d:
            replies = [await d.complete(lanes.Job(messages=JOB)) for _ in range(500)]
            counted = d.statistics().explored
    explored = sum(r.explored for r in replies)
    assert 70 <= explored <= 130, explored
    assert all(r.lane == "b" for r in replies if r.explored) and counted == explored


@pytest.mark.free_lane
async def test_a_404_refreshes_the_catalog_and_reroutes(env, autojump_clock):
    """The model vanishes (404): the job moves on at once and the lane's model list is refetched."""
    async with open_fake("a", models=("m1", "m2")) as a:
        a.catalog = [{"id": "m1"}, {"id": "m2"}]
        cfg = config({**free_lane("a", a.base_url, ["placeholder"], discover=True), "models": []})
        async with lanes.open_dispatcher(cfg, env=env) as d:
            await trio.sleep(1)  # the startup fetch
            assert [c.model for c in d.lanes["a"].candidates] == ["m1", "m2"]
            a.script(
                "m1",
                status(404, {"error": {"message": "model not found", "code": "model_not_found"}}),
            )
            a.catalog = [{"id": "m2"}]
            fetched = a.catalog_requests
            reply = await d.complete(lanes.Job(messages=JOB))
            await trio.sleep(1)
            models_after = [c.model for c in d.lanes["a"].candidates]
    assert reply.model == "m2" and [x.outcome for x in reply.attempts] == ["model_gone", "ok"]
    assert a.catalog_requests == fetched + 1 and models_after == ["m2"]


@pytest.mark.free_lane
async def test_empty_pool_refreshes_once_before_giving_up(env, autojump_clock):
    """Every listed model is backed off: one catalog fetch finds a new free model, which serves."""
    async with open_fake("a", models=("m1", "m2")) as a:
        a.catalog = [{"id": "m1"}]
        a.script("m1", rate_limited(retry_after=600))
        cfg = config(
            {**free_lane("a", a.base_url, ["placeholder"], discover=True), "models": []}, policy={}
        )
        async with lanes.open_dispatcher(cfg, env=env) as d:
            await trio.sleep(1)
            with pytest.raises(lanes.FreeTierExhausted):
                await d.complete(lanes.Job(messages=JOB))
            a.catalog = [{"id": "m1"}, {"id": "m2"}]
            reply = await d.complete(lanes.Job(messages=JOB))
    assert reply.model == "m2"


@pytest.mark.free_lane
async def test_sticky_conversation_stays_on_its_model(env, autojump_clock):
    """A conversation's second turn stays on the first's model, though another now ranks higher."""
    async with open_fake("a", models=("m",)) as a, open_fake("b", models=("m",)) as b:
        cfg = config(free_lane("a", a.base_url, ["m"]), free_lane("b", b.base_url, ["m"]))
        async with lanes.open_dispatcher(cfg, env=env) as d:
            first = await d.complete(lanes.Job(messages=JOB, client="c1"))
            for _ in range(30):  # b builds a better record through pinned jobs; a gets a penalty
                await d.complete(lanes.Job(messages=JOB, model="b/m"))
            a.script("m", status(503))  # a fault: a gets a penalty
            with pytest.raises(lanes.JobFailed):
                await d.complete(lanes.Job(messages=JOB, model="a/m"))
            a.script("m", answer())
            second_turn = JOB + [
                {"role": "assistant", "content": first.text},
                {"role": "user", "content": "more"},
            ]
            sticky = await d.complete(lanes.Job(messages=second_turn, client="c1"))
            fresh = await d.complete(
                lanes.Job(messages=[{"role": "user", "content": "other"}], client="c1")
            )
    assert first.lane == "a" and sticky.lane == "a" and fresh.lane == "b"


async def test_simulation_shows_discovered_models():
    """`lanes serve --simulate`: the OpenRouter-like lane's discovered free model is routable and
    listed; its paid and unpriced models are not."""
    from lanes._http.server import serve
    from lanes.testing.simulate import open_simulation

    async with open_simulation({}, flap=False) as sim, trio.open_nursery() as nursery:
        cfg = lanes.load_config({**sim.config, "server": {"port": 0}}, env={})
        url = await nursery.start(
            lambda task_status: serve(cfg, env=sim.env, task_status=task_status)
        )
        async with httpx2.AsyncClient(trust_env=False) as http:
            for _ in range(50):
                models = {m["id"] for m in (await http.get(f"{url}/v1/models")).json()["data"]}
                if "openrouter/mistral-7b:free" in models:
                    break
                await trio.sleep(0.05)
            page = (await http.get(f"{url}/v1/lanes")).json()
        nursery.cancel_scope.cancel()
    assert "openrouter/mistral-7b:free" in models
    assert "openrouter/gpt-unpriced" not in models
    openrouter = next(lane for lane in page["lanes"] if lane["name"] == "openrouter")
    assert "mistral-7b:free" in [m["model"] for m in openrouter["models"]]


def test_a_catalogs_output_cap_is_read():
    """`max_completion_tokens` (Groq's listing, OpenRouter's `top_provider`) is the model's output
    cap; a cap beyond the bound, or none, is unknown."""
    groq = {"data": [{"id": "a", "max_completion_tokens": 8192}, {"id": "b"}]}
    router = {
        "data": [
            {"id": "c", "top_provider": {"max_completion_tokens": 16384}},
            {"id": "d", "max_completion_tokens": 10**12},
        ]
    }
    caps = [r.max_output_tokens for r in normalise("openai", groq)]
    caps += [r.max_output_tokens for r in normalise("per_token_prices", router)]
    assert caps == [8192, None, 16384, None]


@pytest.mark.parametrize(
    ("failed", "streak", "wait_s"),
    [
        (None, 0, 21_600.0),  # it worked: the configured refresh
        (ModelLoading("HTTP 503: Loading model"), 7, 2.0),  # loading: every 2 s, however long
        (RetryableError("refused", category="connect"), 1, 1.0),  # not started yet: soon
        (RetryableError("refused", category="connect"), 4, 8.0),  # doubling
        (RetryableError("refused", category="connect"), 30, 60.0),  # to a minute
        (TimeoutError("no answer within 30 s"), 2, 2.0),
        (FinalError("HTTP 401: invalid key"), 1, 21_600.0),  # a refused key: the configured wait
    ],
)
def test_a_model_list_not_had_is_asked_again_sooner(failed, streak, wait_s):
    """After a failed round the model list is asked again sooner than `catalog_refresh_s`: every
    2 s while the server says it is loading, else after 1 s doubling to a minute; a final answer
    (a refused key) waits the whole refresh."""
    assert next_round_s(21_600.0, failed, streak) == wait_s
    assert next_round_s(5.0, failed, streak) == min(5.0, wait_s)

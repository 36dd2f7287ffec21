"""Embedding jobs through the dispatcher: the same walk, budgets and audit as a chat, never another
model; and the library's own simulation."""

from __future__ import annotations

import pytest
import trio

import lanes
from helpers import config, free_lane, local_lane, paid_lane
from lanes._core.freetier.prices import usage_cost, usage_tokens
from lanes.testing import ANSWER, open_fake, rate_limited, status

EMB = [{"id": "emb", "embedding": True}]


def embedding(model: str = "emb", **kw) -> lanes.Job:
    return lanes.Job(input=["first", "second"], model=model, deadline_s=5, **kw)


def test_a_job_is_a_chat_or_an_embedding():
    """input and messages exclude each other; empty input is refused by name."""
    with pytest.raises(ValueError, match="not both"):
        lanes.Job(messages=[{"role": "user", "content": "x"}], input="x")
    with pytest.raises(ValueError, match="input"):
        lanes.Job(input=[])
    with pytest.raises(ValueError, match=r"input\[1\]"):
        lanes.Job(input=["a", ""])
    with pytest.raises(ValueError, match="messages"):
        lanes.Job()
    job = lanes.Job(input=[[1, 2], [3]], model="emb", params={"dimensions": 8})
    assert job.embedding and job.body("emb") == {
        "dimensions": 8,
        "model": "emb",
        "input": [[1, 2], [3]],
    }


def test_an_embeddings_usage_is_usage():
    """Prompt tokens with an equal total and no completion count: usage, priced by input alone."""
    assert usage_tokens({"prompt_tokens": 7, "total_tokens": 7}) == (7, 0)
    assert usage_tokens({"prompt_tokens": 7, "total_tokens": 9}) is None
    assert usage_cost({"prompt_tokens": 1_000_000, "total_tokens": 1_000_000}, 0.02, None) == 0.02
    assert usage_cost({"prompt_tokens": 1, "completion_tokens": 1}, 0.02, None) is None


async def test_the_doors_keep_their_kind(env, autojump_clock):
    """complete() refuses an embedding job and embed() a chat; chat `auto` never reaches an
    embedding model, and an embedding never reaches a chat model."""
    async with open_fake("a", models=("chat", "emb")) as a:
        conf = config(
            local_lane("a", a.base_url, models=["chat"]) | {"models": [{"id": "chat"}, *EMB]}
        )
        async with lanes.open_dispatcher(conf, env=env) as d:
            with pytest.raises(ValueError):
                await d.complete(embedding())
            with pytest.raises(ValueError):
                await d.embed(lanes.Job(messages=[{"role": "user", "content": "x"}]))
            chat = await d.complete(lanes.Job(messages=[{"role": "user", "content": "x"}]))
            with pytest.raises(lanes.Unservable, match="not an embedding model"):
                await d.embed(embedding("chat"))
            with pytest.raises(lanes.Unservable, match="'auto'"):
                await d.embed(embedding("auto"))
            with pytest.raises(lanes.Unservable, match="is an embedding model"):
                await d.complete(
                    lanes.Job(messages=[{"role": "user", "content": "x"}], model="emb")
                )
    assert chat.model == "chat" and [r.model for r in a.requests()] == ["chat"]


@pytest.mark.free_lane
async def test_an_embedding_counts_against_quotas_and_is_audited(env, autojump_clock):
    """A free lane's embedding counts as a request; its 429 backs the lane off; the same model on
    another lane serves; the audit row hashes the input, under class `embedding`."""
    async with open_fake("free", models=("emb",)) as free, open_fake("own", models=("emb",)) as own:
        free.script("emb", rate_limited(retry_after=30))
        conf = config(
            local_lane("own", own.base_url) | {"models": EMB},
            free_lane("free", free.base_url) | {"models": EMB},
            aliases={"vectors": ["free/emb", "own/emb"]},
        )
        async with lanes.open_dispatcher(conf, env=env) as d:
            reply = await d.embed(embedding("vectors"))
            stats = d.statistics().model("free/emb")
            rows = d.take_audit_rows()
    assert reply.lane == "own" and [a.outcome for a in reply.attempts] == ["rate_limited", "ok"]
    assert stats.used_today == 1 and stats.backoff_s > 20
    [row] = rows
    assert row["class"] == "embedding" and row["outcome"] == "ok" and row["lane"] == "own"
    assert row["request_bytes"] == len('["first","second"]') and row["body"] == ""
    assert row["tokens"] > 0


async def test_a_paid_embedding_reserves_its_input_and_settles_its_usage(env, autojump_clock):
    """The paid reservation is the input's bytes at the input price; it settles to the usage."""
    async with open_fake("paid", models=("emb",)) as paid:
        lane_cfg = paid_lane("paid", paid.base_url) | {
            "models": [{"id": "emb", "embedding": True, "input_usd_per_mtok": 1.0}]
        }
        conf = config(
            lane_cfg, policy={"free_tier_fallback": "allow", "paid_ceiling_usd_per_day": 1}
        )
        async with lanes.open_dispatcher(conf, env=env) as d:
            reply = await d.embed(embedding())
            spent = d.paid_spent_today()
    assert reply.route == "paid_fallback" and "max_tokens" not in paid.requests()[0].body
    tokens = reply.body["usage"]["prompt_tokens"]
    assert reply.cost_usd == pytest.approx(tokens / 1e6) and spent == pytest.approx(tokens / 1e6)


async def test_a_fault_moves_to_the_same_model_only(env, autojump_clock):
    """A bare model id is every lane's model of that id: a fault moves along them, then stops."""
    async with open_fake("a", models=("emb",)) as a, open_fake("b", models=("emb", "emb-2")) as b:
        a.script("emb", status(503))
        b.script("emb", status(503))
        conf = config(
            local_lane("a", a.base_url) | {"models": EMB},
            local_lane("b", b.base_url) | {"models": [*EMB, {"id": "emb-2", "embedding": True}]},
        )
        async with lanes.open_dispatcher(conf, env=env) as d:
            with pytest.raises(lanes.NoLaneAvailable):
                await d.embed(embedding())
    assert {r.model for r in [*a.requests(), *b.requests()]} == {"emb"}


async def test_a_dated_name_resolves_to_its_alias(env, autojump_clock):
    """`name-YYYYMMDD` is the alias `name` when no model has that id."""
    async with open_fake("a", models=("m",)) as a:
        conf = config(local_lane("a", a.base_url, models=["m"]), aliases={"claude-x-1": ["a/m"]})
        async with lanes.open_dispatcher(conf, env=env) as d:
            reply = await d.complete(
                lanes.Job(messages=[{"role": "user", "content": "x"}], model="claude-x-1-20250101")
            )
            with pytest.raises(lanes.UnknownModel):
                await d.complete(
                    lanes.Job(messages=[{"role": "user", "content": "x"}], model="claude-x-1-2025")
                )
    assert reply.lane == "a"


async def test_the_library_simulates_on_its_own(autojump_clock):
    """open_dispatcher(simulate=True): chat, a tool call, a stream and an embedding, with no config
    file, no key and no network."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    async with lanes.open_dispatcher(simulate=True, env={}) as d:
        reply = await d.complete(lanes.Job(messages=[{"role": "user", "content": "Say hi"}]))
        called = await d.complete(
            lanes.Job(messages=[{"role": "user", "content": "Call f"}], params={"tools": tools})
        )
        async with d.open_stream(lanes.Job(messages=[{"role": "user", "content": "Hi"}])) as stream:
            text = "".join(
                [
                    c["choices"][0]["delta"].get("content") or ""
                    async for c in stream
                    if c["choices"]
                ]
            )
        vectors = await d.embed(lanes.Job(input="hello", model="nomic-embed-text"))
        lane_names = set(d.lanes)
    assert reply.text == text == ANSWER
    assert called.body["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "f"
    assert len(vectors.body["data"]) == 1 and vectors.lane == "local"
    assert lane_names == {"local", "groq", "gemini", "openrouter", "paid"}


def test_complete_sync_simulates_too():
    """complete_sync(None, job, simulate=True) answers outside trio, and embeds a job with input."""
    reply = lanes.complete_sync(
        None, lanes.Job(messages=[{"role": "user", "content": "hi"}]), simulate=True
    )
    vectors = lanes.complete_sync(
        None, lanes.Job(input="hi", model="nomic-embed-text"), simulate=True
    )
    assert reply.text == ANSWER and vectors.body["object"] == "list"
    with pytest.raises(ValueError, match="simulate=True"):
        trio.run(_open_without_config)


async def _open_without_config() -> None:
    async with lanes.open_dispatcher():
        pass

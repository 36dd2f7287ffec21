"""The response cache's rules, pure: what a request does with the cache, its key (never shared
across clients), which answers are whole, and a stream's answer put together and given back."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import examples
from lanes import Job
from lanes._core.cache.rules import (
    Assembler,
    cache_key,
    chunks_of,
    deterministic,
    plan,
    streamed_again,
    whole,
)

USER = [{"role": "user", "content": "Say hi"}]


def job(**kw: Any) -> Job:
    return Job(messages=kw.pop("messages", USER), **kw)


@pytest.mark.parametrize(
    ("mode", "asked", "params", "expected"),
    [
        ("off", "on", {"temperature": 0}, (False, False, None)),  # off: a request can not opt in
        ("on", None, {"temperature": 0}, (True, True, "miss")),
        ("on", None, {"seed": 7}, (True, True, "miss")),
        ("on", None, {"temperature": 0.7}, (False, False, "bypass")),  # not deterministic
        ("on", None, {}, (False, False, "bypass")),
        ("on", "on", {"temperature": 0.7}, (True, True, "miss")),  # the request opts in
        ("on", "off", {"temperature": 0}, (False, False, "bypass")),
        ("on", "refresh", {"temperature": 0}, (False, True, "miss")),
        ("write_only", None, {"temperature": 0}, (False, True, "miss")),
        ("write_only", "on", {"temperature": 0}, (True, True, "miss")),
        ("write_only", "refresh", {"seed": 1}, (False, True, "miss")),
    ],
)
def test_what_a_request_does_with_the_cache(mode, asked, params, expected):
    got = plan(mode, job(params=params, cache=asked), any_sampling=False)
    assert (got.read, got.write, got.status) == expected


def test_any_sampling_makes_every_request_cacheable_and_privacy_bypasses():
    assert plan("on", job(params={"temperature": 1}), any_sampling=True).read
    for privacy in ("zdr", "local"):
        found = plan("on", job(params={"temperature": 0}, privacy=privacy), any_sampling=True)
        assert (found.read, found.write, found.status) == (False, False, "bypass")
    embedding = Job(input="a text", params={"temperature": 0})
    assert plan("on", embedding, any_sampling=True).status == "bypass"


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"temperature": 0}, True),
        ({"temperature": 0.0}, True),
        ({"temperature": False}, False),  # a boolean is no temperature
        ({"seed": 0}, True),
        ({"seed": True}, False),
        ({"seed": "1"}, False),
        ({"temperature": 0.2}, False),
    ],
)
def test_determinism_is_temperature_zero_or_a_seed(params, expected):
    assert deterministic(params) is expected


texts = st.text(max_size=30)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
params_strategy = st.dictionaries(
    st.sampled_from(["temperature", "seed", "max_tokens", "top_p", "tools", "n", "user", "stop"]),
    json_values,
    max_size=4,
)
messages_strategy = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": texts}),
    min_size=1,
    max_size=3,
)


@settings(max_examples=examples(200), deadline=None)
@given(
    clients=st.lists(st.text(min_size=1, max_size=12), min_size=2, max_size=2, unique=True),
    messages=messages_strategy,
    params=params_strategy,
    model=st.sampled_from(["auto", "fast", "free/free-model"]),
)
def test_a_key_is_never_shared_across_clients(clients, messages, params, model):
    """The same request from two clients has two keys: one client's answer is never another's."""
    first, second = (job(messages=messages, params=params, model=model, client=c) for c in clients)
    assert cache_key(first) != cache_key(second)


@settings(max_examples=examples(200), deadline=None)
@given(messages=messages_strategy, params=params_strategy, other=params_strategy)
def test_the_key_is_the_request_less_how_it_is_delivered(messages, params, other):
    """`stream` and `stream_options` are not part of the key; every other parameter is."""
    asked = job(messages=messages, params=params)
    streamed = job(messages=messages, params={**params, "stream": True, "stream_options": {"a": 1}})
    assert cache_key(asked) == cache_key(streamed)
    changed = job(messages=messages, params={**params, **other})
    same = {k: v for k, v in {**params, **other}.items()} == params
    assert (cache_key(changed) == cache_key(asked)) == same
    assert cache_key(job(messages=messages, params=params, model="other")) != cache_key(asked)
    longer = [*messages, {"role": "user", "content": "more"}]
    assert cache_key(job(messages=longer, params=params)) != cache_key(asked)


tool_calls = st.lists(
    st.fixed_dictionaries(
        {
            "id": st.text(min_size=1, max_size=8),
            "type": st.just("function"),
            "function": st.fixed_dictionaries(
                {"name": st.text(min_size=1, max_size=8), "arguments": texts}
            ),
        }
    ),
    max_size=3,
)


@st.composite
def bodies(draw: st.DrawFn) -> dict[str, Any]:
    """Whole chat completions: one or more choices, text and/or tool calls, usage or not."""
    choices = []
    for index in range(draw(st.integers(1, 3))):
        message: dict[str, Any] = {"role": "assistant", "content": draw(st.none() | texts)}
        if calls := draw(tool_calls):
            message["tool_calls"] = calls
        if draw(st.booleans()):
            message["reasoning_content"] = draw(texts)
        reason = draw(st.sampled_from(["stop", "length", "tool_calls", "content_filter"]))
        choices.append({"index": index, "message": message, "finish_reason": reason})
    body: dict[str, Any] = {
        "id": "chatcmpl-original",
        "object": "chat.completion",
        "created": draw(st.integers(0, 2**31)),
        "model": draw(st.text(min_size=1, max_size=10)),
        "choices": choices,
    }
    if draw(st.booleans()):
        body["usage"] = {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    return body


def _normal(body: dict[str, Any]) -> dict[str, Any]:
    """A body as its replay gives it back: an empty text is no text (a stream can not tell)."""
    out = copy.deepcopy(body)
    out.pop("id")
    for choice in out["choices"]:
        message = choice["message"]
        for name in ("content", "reasoning_content"):
            if not message.get(name):
                message.pop(name, None)
    return out


@settings(max_examples=examples(300), deadline=None)
@given(body=bodies(), split=st.integers(1, 7))
def test_a_stream_replayed_from_an_entry_puts_together_the_same_answer(body, split):
    """An entry given back as chunks, read by the assembler a stream is kept with, is the same
    chat completion (ids aside) — so a hit streamed, and a stream kept, lose nothing."""
    assert whole(body)
    chunks = chunks_of(body, "chatcmpl-new", usage=True)
    assert all(c["id"] == "chatcmpl-new" for c in chunks)
    assembler = Assembler(limit=10**6)
    for chunk in chunks:
        if not chunk["choices"]:
            continue  # the usage chunk: the stream's usage is handed over at the end
        # a text split in pieces, as an upstream streams it
        for piece in _pieces(chunk, split):
            assembler.add(piece, None)
    again = assembler.body(body.get("usage"))
    assert again is not None
    assert _normal(again) == _normal(body)


def _pieces(chunk: dict[str, Any], split: int) -> list[dict[str, Any]]:
    choice = chunk["choices"][0]
    content = choice["delta"].get("content")
    if not isinstance(content, str) or len(content) < 2:
        return [chunk]
    at = max(1, len(content) // split)
    first = {
        **chunk,
        "choices": [{**choice, "delta": {**choice["delta"], "content": content[:at]}}],
    }
    rest = {"index": choice["index"], "delta": {"content": content[at:]}}
    return [first, {**chunk, "choices": [rest]}]


@pytest.mark.parametrize(
    "body",
    [
        {"error": {"message": "overloaded"}, "choices": []},  # a 200 carrying an error
        {"choices": [{"index": 0, "message": {"content": "cut"}, "finish_reason": None}]},
        {"choices": []},
        {
            "choices": [{"index": 0, "message": {"content": "a"}, "finish_reason": "stop"}],
            "error": 1,
        },
        {  # logprobs: a stream's replay would not carry them
            "choices": [
                {
                    "index": 0,
                    "message": {"content": "a"},
                    "finish_reason": "stop",
                    "logprobs": {"content": []},
                }
            ]
        },
        {  # audio: a field the replay does not give back
            "choices": [{"index": 0, "message": {"audio": {"id": "x"}}, "finish_reason": "stop"}]
        },
    ],
)
def test_what_is_not_a_whole_success_is_never_stored(body):
    assert not whole(body)


def test_an_unfinished_or_oversized_stream_is_not_put_together():
    unfinished = Assembler(limit=1000)
    unfinished.add({"choices": [{"index": 0, "delta": {"content": "half"}}]}, None)
    assert unfinished.body(None) is None
    large = Assembler(limit=50)
    large.add({"choices": [{"index": 0, "delta": {"content": "x" * 40}}]}, None)
    large.add({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}, None)
    assert large.body(None) is None
    odd = Assembler(limit=1000)
    odd.add({"choices": [{"index": 0, "delta": {"audio": {"data": "x"}}}]}, None)
    odd.add({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}, None)
    assert odd.body(None) is None


@settings(max_examples=examples(200), deadline=None)
@given(body=bodies(), cut=st.integers(0, 20), usage=st.booleans(), asked=st.booleans())
def test_a_kept_stream_replays_its_own_chunks_and_a_cut_one_is_never_kept(body, cut, usage, asked):
    """A stream kept whole is replayed chunk for chunk, the same bytes but for the id (the usage
    chunk as the hit asks); any stream cut before its last finish is not kept at all."""
    body = {**body, "id": "chatcmpl-orig"}
    chunks = chunks_of(body, "chatcmpl-orig", usage=usage)
    raws = [json.dumps(c) for c in chunks]
    whole_one = Assembler(limit=10**6)
    for chunk, raw in zip(chunks, raws, strict=True):
        whole_one.add(chunk, raw)
    kept = whole_one.kept(body.get("usage"))
    assert kept is not None
    again = streamed_again(json.loads(json.dumps(kept)), "chatcmpl-new", usage=asked)
    told = [data for _, data in again]
    expected = [r.replace('"chatcmpl-orig"', '"chatcmpl-new"') for r in raws]
    if not asked:
        expected = [r for r, c in zip(expected, chunks, strict=True) if c["choices"]]
    elif not usage and "usage" in body:
        assert json.loads(told[-1])["usage"] == body["usage"]  # asked now: made up at the end
        told = told[:-1]
    assert told == expected
    assert all(chunk == json.loads(data) for chunk, data in again)
    last_finish = max(
        i for i, c in enumerate(chunks) if any(x.get("finish_reason") for x in c["choices"])
    )
    cut_at = min(cut, last_finish)
    partial = Assembler(limit=10**6)
    for chunk, raw in zip(chunks[:cut_at], raws[:cut_at], strict=True):
        partial.add(chunk, raw)
    cut_kept = partial.kept(body.get("usage"))
    # cut before its last finish: not kept, or (a choice never begun) not the choices asked for
    assert cut_kept is None or not whole(cut_kept["completion"], len(body["choices"]))

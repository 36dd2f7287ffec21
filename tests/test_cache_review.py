"""The response cache under a hostile review: what a hostile client, a broken upstream or an
operator could make it do that it must not — each test failed before its fix."""

from __future__ import annotations

import json
from typing import Any

import httpx2

from lanes.testing import raw
from sidecar import open_sidecar

LOCAL = ("local", "local", ["local-model"])
ASK: Any = [{"role": "user", "content": "Say hi"}]
ON = {"mode": "on"}


async def chat(url: str, body: dict[str, Any], **headers: str) -> httpx2.Response:
    async with httpx2.AsyncClient(trust_env=False, timeout=10) as http:
        return await http.post(f"{url}/chat/completions", json=body, headers=headers)


def asked(**more: Any) -> dict[str, Any]:
    return {"model": "auto", "messages": ASK, "temperature": 0, **more}


async def test_a_200_whose_choice_says_error_is_never_stored():
    """OpenRouter's way of failing inside a 200: the choice's `finish_reason` is `error`, with the
    error beside it — an answer to pass on, never one to serve again for a day."""
    failed = {
        "id": "gen-1",
        "object": "chat.completion",
        "model": "local-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "The quick"},
                "finish_reason": "error",
                "error": {"code": 502, "message": "Provider disconnected"},
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }
    async with open_sidecar(LOCAL, cache=ON) as (url, fakes):
        fakes["local"].script("local-model", raw(200, json.dumps(failed).encode()))
        await chat(url, asked())
        fakes["local"].script("local-model")
        again = await chat(url, asked())
        assert len(fakes["local"].requests()) == 2
    assert again.headers["x-lanes-cache"] == "miss"
    assert again.json()["choices"][0]["finish_reason"] == "stop"


def _sse(*chunks: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + (
        b"data: [DONE]\n\n"
    )


async def test_a_stream_whose_choice_ends_in_error_is_never_stored():
    """The same inside a stream: the last chunk's choice ends with `error` (and says it), no
    top-level error — the reader passes it on as a finish, the cache must not keep it."""
    head = {"id": "gen-1", "object": "chat.completion.chunk", "model": "local-model"}
    body = _sse(
        {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "The"}}]},
        {
            **head,
            "choices": [
                {
                    "index": 0,
                    "delta": {"content": ""},
                    "finish_reason": "error",
                    "error": {"code": 502, "message": "Provider disconnected"},
                }
            ],
        },
    )
    streamed = raw(200, body, headers={"content-type": "text/event-stream"})
    async with open_sidecar(LOCAL, cache=ON) as (url, fakes):
        fakes["local"].script("local-model", streamed)
        await chat(url, asked(stream=True))
        fakes["local"].script("local-model")
        again = await chat(url, asked())
        assert len(fakes["local"].requests()) == 2
    assert again.headers["x-lanes-cache"] == "miss"


async def test_the_sections_off_keeps_the_cache_off_for_a_client_that_says_on():
    """`[cache] mode = "off"` is the operator's word for every client (the config reference says
    so): a client's own `cache = "on"` must not turn storing answers back on for it."""
    server = {"clients": {"a": {"key_env": "KEY_A", "cache": "on"}}}
    env = {"KEY_A": "client-a-key-0123456789"}
    a = {"Authorization": f"Bearer {env['KEY_A']}"}
    async with open_sidecar(LOCAL, cache={"mode": "off"}, server=server, env=env) as (url, fakes):
        first = await chat(url, asked(), **a)
        second = await chat(url, asked(), **a)
        assert len(fakes["local"].requests()) == 2
    assert "x-lanes-cache" not in first.headers and "x-lanes-cache" not in second.headers


async def test_an_answer_made_with_a_clients_own_provider_key_needs_that_key():
    """An answer a request's own provider key (`X-Lanes-Key-<lane>`) paid for, from a model that
    key may reach, is that key's: the same client key without it (or with another) does not get
    it from the cache — the provider key is used "for that job only" — while the same key does."""
    own = ("own", "free", ["own-model"], {"byok": True})
    mine, theirs = "sk-own-key-0123456789abcdef", "sk-other-key-0123456789abcd"
    async with open_sidecar(own, cache=ON) as (url, fakes):
        made = await chat(url, asked(), **{"X-Lanes-Key-own": mine})
        keyless = await chat(url, asked())
        other = await chat(url, asked(), **{"X-Lanes-Key-own": theirs})
        again = await chat(url, asked(), **{"X-Lanes-Key-own": mine})
        sent = len(fakes["own"].requests())
    assert made.headers["x-lanes-route"] == "byok"
    assert keyless.status_code != 200  # no lane it may use: not the other key's answer
    assert other.headers["x-lanes-cache"] == "miss"
    assert again.headers["x-lanes-cache"] == "hit"
    assert sent == 2

"""The response cache over real loopback sockets, with the official SDKs as clients: a repeated
request is answered once, in every door and form, scoped per client key; errors, broken streams and
paid answers are never served again; `X-Lanes-Cache` says what happened."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import anthropic
import httpx2
import openai
import pytest
import redis
import trio

from lanes.testing import raw, status, stream_cut
from sidecar import open_sidecar

LOCAL = ("local", "local", ["local-model"])
PAID = ("paid", "paid", ["paid-model"])
ASK: Any = [{"role": "user", "content": "Say hi"}]
ON = {"mode": "on"}
KEYS = {"KEY_A": "client-a-key-0123456789", "KEY_B": "client-b-key-0123456789"}
TWO_CLIENTS = {"clients": {"a": "KEY_A", "b": "KEY_B"}}


async def chat(url: str, body: dict[str, Any], **headers: str) -> httpx2.Response:
    async with httpx2.AsyncClient(trust_env=False, timeout=10) as http:
        return await http.post(f"{url}/chat/completions", json=body, headers=headers)


def asked(**more: Any) -> dict[str, Any]:
    return {"model": "auto", "messages": ASK, "temperature": 0, **more}


def without_ids(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != "id"}


def sse_events(text: str) -> list[Any]:
    return [
        json.loads(line[6:])
        for line in text.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]


async def test_a_repeated_request_is_answered_once_with_its_answer_and_usage():
    async with open_sidecar(LOCAL, cache=ON) as (url, fakes):
        first = await chat(url, asked())
        second = await chat(url, asked())
        assert len(fakes["local"].requests()) == 1
    assert first.headers["x-lanes-cache"] == "miss"
    assert second.headers["x-lanes-cache"] == "hit"
    assert second.headers["x-lanes-route"] == "cache"
    assert second.headers["x-lanes-lane"] == "local"
    assert int(second.headers["age"]) >= 0
    assert second.headers["x-lanes-request-id"] != first.headers["x-lanes-request-id"]
    assert second.json()["id"] != first.json()["id"]
    assert without_ids(second.json()) == without_ids(first.json())  # content and usage


async def test_a_stream_is_kept_and_a_hit_replays_in_the_form_asked():
    async with open_sidecar(LOCAL, cache=ON) as (url, fakes):
        streamed = await chat(url, asked(stream=True, stream_options={"include_usage": True}))
        as_json = await chat(url, asked())
        again = await chat(url, asked(stream=True, stream_options={"include_usage": True}))
        assert len(fakes["local"].requests()) == 1
    assert (streamed.headers["x-lanes-cache"], as_json.headers["x-lanes-cache"]) == ("miss", "hit")
    assert again.headers["x-lanes-cache"] == "hit"
    assert again.headers["content-type"].startswith("text/event-stream")
    assert again.text.rstrip().endswith("data: [DONE]")
    first, replayed = sse_events(streamed.text), sse_events(again.text)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in first if c["choices"])
    assert as_json.json()["choices"][0]["message"]["content"] == text
    assert (
        "".join(c["choices"][0]["delta"].get("content") or "" for c in replayed if c["choices"])
        == text
    )
    assert replayed[-1]["usage"] == first[-1]["usage"] == as_json.json()["usage"]


async def test_the_sdks_parse_hits_on_every_door_streamed_and_not():
    async with open_sidecar(LOCAL, cache=ON) as (url, fakes):
        client = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)
        made = await client.chat.completions.create(model="auto", messages=ASK, temperature=0)
        hit = await client.chat.completions.create(model="auto", messages=ASK, temperature=0)
        async with await client.chat.completions.create(
            model="auto", messages=ASK, temperature=0, stream=True
        ) as stream:
            pieces = [c.choices[0].delta.content or "" async for c in stream if c.choices]
        claude = anthropic.AsyncAnthropic(base_url=url[:-3], api_key="unused", max_retries=0)
        # the newest SDK has no `temperature` argument: a client that sends one, as Claude Code does
        said = {
            "model": "auto",
            "max_tokens": 64,
            "messages": ASK,
            "extra_body": {"temperature": 0},
        }
        first = await claude.messages.create(**said)
        second = await claude.messages.create(**said)
        async with claude.messages.stream(**said) as claude_stream:
            streamed = await claude_stream.get_final_message()
        told: Any = {"model": "auto", "input": "Say hi", "temperature": 0}
        response = await client.responses.create(**told)
        async with client.responses.stream(**told) as responses_stream:
            final = await responses_stream.get_final_response()
        sent = len(fakes["local"].requests())
    assert hit.choices[0].message.content == made.choices[0].message.content
    assert hit.usage == made.usage and hit.id != made.id
    assert "".join(pieces) == made.choices[0].message.content
    assert second.content == first.content and second.usage == first.usage
    assert [b.text for b in streamed.content] == [b.text for b in first.content]  # type: ignore[union-attr]
    assert final.output_text == response.output_text
    # the chat request and the Messages one (its max_tokens makes it another request) were sent
    # once each; the Responses one asks what the chat request asked, and is its hit
    assert sent == 2


async def test_one_clients_answer_is_never_served_to_another():
    async with open_sidecar(LOCAL, cache=ON, server=TWO_CLIENTS, env=KEYS) as (url, fakes):
        a = {"Authorization": f"Bearer {KEYS['KEY_A']}"}
        b = {"Authorization": f"Bearer {KEYS['KEY_B']}"}
        first = await chat(url, asked(), **a)
        other = await chat(url, asked(), **b)
        again = await chat(url, asked(), **a)
        assert len(fakes["local"].requests()) == 2
    assert [r.headers["x-lanes-cache"] for r in (first, other, again)] == ["miss", "miss", "hit"]


@pytest.mark.parametrize(
    "failure",
    [
        status(500),
        status(400, {"error": {"message": "bad", "type": "invalid_request_error"}}),
        raw(200, b'{"error": {"message": "overloaded", "type": "server_error"}}'),
    ],
    ids=["500", "400", "200-with-error"],
)
async def test_an_error_is_never_stored(failure):
    async with open_sidecar(LOCAL, cache=ON) as (url, fakes):
        fakes["local"].script("local-model", failure, failure)
        await chat(url, asked())
        fakes["local"].script("local-model")  # the default: an answer
        tried = len(fakes["local"].requests())
        fresh = await chat(url, asked())
        assert len(fakes["local"].requests()) == tried + 1
    assert fresh.status_code == 200
    assert fresh.headers["x-lanes-cache"] == "miss"


async def test_a_broken_stream_is_never_stored():
    async with open_sidecar(LOCAL, cache=ON) as (url, fakes):
        fakes["local"].script("local-model", stream_cut(after=2))
        broken = await chat(url, asked(stream=True))
        fakes["local"].script("local-model")
        fresh = await chat(url, asked())
    assert "data: [DONE]" not in broken.text
    assert fresh.headers["x-lanes-cache"] == "miss"


async def test_a_paid_answer_is_not_kept_unless_the_operator_says_so():
    policy = {"free_tier_fallback": "allow", "paid_ceiling_usd_per_day": 1.0}
    async with open_sidecar(PAID, cache=ON, policy=policy) as (url, fakes):
        await chat(url, asked())
        again = await chat(url, asked())
        assert len(fakes["paid"].requests()) == 2
    assert again.headers["x-lanes-cache"] == "miss"
    async with open_sidecar(PAID, cache={**ON, "keep_paid": True}, policy=policy) as (url, fakes):
        await chat(url, asked())
        again = await chat(url, asked())
        assert len(fakes["paid"].requests()) == 1
    assert again.headers["x-lanes-cache"] == "hit"
    assert again.headers["x-lanes-cost-usd"] == "0"


async def test_what_a_request_asks_of_the_cache():
    async with open_sidecar(LOCAL, cache={"mode": "write_only"}) as (url, fakes):
        kept = await chat(url, asked())
        unread = await chat(url, asked())  # write_only: read only when the request asks
        read = await chat(url, asked(), **{"X-Lanes-Cache": "on"})
        fresh = await chat(url, asked(), **{"X-Lanes-Cache": "on", "Cache-Control": "no-cache"})
        refreshed = await chat(url, asked(), **{"X-Lanes-Cache": "refresh"})
        off = await chat(url, asked(), **{"X-Lanes-Cache": "off"})
        sampled = await chat(url, asked(temperature=0.8))
        bad = await chat(url, asked(), **{"X-Lanes-Cache": "maybe"})
        assert len(fakes["local"].requests()) == 5
    assert [r.headers["x-lanes-cache"] for r in (kept, unread, read, refreshed, off, sampled)] == [
        "miss",
        "miss",
        "hit",
        "miss",
        "bypass",
        "bypass",
    ]
    assert fresh.headers["x-lanes-cache"] == "hit"  # X-Lanes-Cache wins over Cache-Control
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "X-Lanes-Cache"


async def test_off_by_default_no_header_and_nothing_kept():
    async with open_sidecar(LOCAL) as (url, fakes):
        first = await chat(url, asked())
        second = await chat(url, asked(), **{"X-Lanes-Cache": "on"})
        assert len(fakes["local"].requests()) == 2
    assert "x-lanes-cache" not in first.headers and "x-lanes-cache" not in second.headers


async def test_a_hit_is_audited_as_route_cache_with_what_it_saved(tmp_path):
    state = str(tmp_path / "state.db")
    async with open_sidecar(LOCAL, cache=ON, state=state) as (url, _):
        await chat(url, asked())
        hit = await chat(url, asked())
        async with httpx2.AsyncClient(trust_env=False) as http:
            for _ in range(200):  # the sync writes the audit within a second
                report = (await http.get(f"{url}/report")).json()["total"]
                if report["jobs"] >= 2:
                    break
                await trio.sleep(0.05)
    request_id = hit.headers["x-lanes-request-id"]
    with sqlite3.connect(state) as db:
        row = db.execute(
            "SELECT route, outcome, lane, tokens, attempts FROM audit WHERE job = ?", (request_id,)
        ).fetchone()
    assert row is not None
    route, outcome, lane, tokens, attempts = row
    assert (route, outcome, lane, attempts) == ("cache", "ok", "local", 0)
    assert tokens == hit.json()["usage"]["total_tokens"]
    assert report["cache_hits"] == 1 and report["cache_saved_tokens"] == tokens
    assert (tmp_path / "state.db.cache").stat().st_mode & 0o077 == 0  # its owner's alone


async def test_the_forecast_counts_hits_and_an_admin_clears_a_clients_entries():
    server = {**TWO_CLIENTS, "admin_key_env": "ADMIN_KEY"}
    env = {**KEYS, "ADMIN_KEY": "admin-key-0123456789abcdef"}
    admin = {"Authorization": f"Bearer {env['ADMIN_KEY']}"}
    a = {"Authorization": f"Bearer {KEYS['KEY_A']}"}
    async with open_sidecar(LOCAL, cache=ON, server=server, env=env) as (url, fakes):
        made = await chat(url, asked(), **a)
        assert made.status_code == 200, made.text
        hit = await chat(url, asked(), **a)
        assert hit.headers["x-lanes-cache"] == "hit"
        async with httpx2.AsyncClient(trust_env=False, timeout=10) as http:
            for _ in range(200):  # the writer writes within its gathering window
                forecast = (await http.get(f"{url}/forecast", headers=admin)).json()
                if forecast["cache"]["entries"]:
                    break
                await trio.sleep(0.05)
            theirs = (await http.get(f"{url}/forecast", headers=a)).json()
            refused = await http.post(f"{url}/cache/clear", json={"client": "a"}, headers=a)
            cleared = await http.post(f"{url}/cache/clear", json={"client": "a"}, headers=admin)
        after = await chat(url, asked(), **a)
        assert len(fakes["local"].requests()) == 2
    counted = forecast["cache"]
    assert (counted["hits"], counted["misses"], counted["entries"]) == (1, 1, 1)
    assert counted["saved_tokens"] > 0
    assert "cache" not in theirs  # every client's figures: an admin's
    assert refused.status_code == 403
    assert cleared.json() == {"deleted": 1, "client": "a"}
    assert after.headers["x-lanes-cache"] == "miss"


async def test_the_gemini_door_replays_a_hit_streamed_and_not():
    async with open_sidecar(LOCAL, cache=ON) as (url, fakes):
        body = {
            "contents": [{"role": "user", "parts": [{"text": "Say hi"}]}],
            "generationConfig": {"temperature": 0},
        }
        base = url[:-3] + "/v1beta/models/auto"
        async with httpx2.AsyncClient(trust_env=False, timeout=10) as http:
            first = await http.post(f"{base}:generateContent", json=body)
            second = await http.post(f"{base}:generateContent", json=body)
            streamed = await http.post(f"{base}:streamGenerateContent?alt=sse", json=body)
        assert len(fakes["local"].requests()) == 1
    assert second.headers["x-lanes-cache"] == "hit" == streamed.headers["x-lanes-cache"]
    text = first.json()["candidates"][0]["content"]["parts"][0]["text"]
    assert second.json()["candidates"][0]["content"] == first.json()["candidates"][0]["content"]
    events = sse_events(streamed.text)
    assert (
        "".join(
            p.get("text", "")
            for e in events
            for c in e.get("candidates", [])
            for p in c["content"]["parts"]
        )
        == text
    )
    assert events[-1]["candidates"][0]["finishReason"] == "STOP"


def data_lines(text: str, *ids: str) -> list[str]:
    """A stream's events (comments aside), each id in `ids` said as `ID`."""
    lines = [line for line in text.splitlines() if line and not line.startswith(":")]
    for one in ids:
        lines = [line.replace(one, "ID") for line in lines]
    return lines


async def test_a_streamed_hit_is_the_streamed_answer_byte_for_byte_but_its_ids():
    messages_body = {"model": "auto", "max_tokens": 64, "messages": ASK, "temperature": 0}
    async with open_sidecar(LOCAL, cache=ON) as (url, _):
        first = await chat(url, asked(stream=True))
        again = await chat(url, asked(stream=True))
        async with httpx2.AsyncClient(trust_env=False, timeout=10) as http:
            said = [
                await http.post(f"{url}/messages", json={**messages_body, "stream": True})
                for _ in range(2)
            ]
    assert again.headers["x-lanes-cache"] == "hit"
    ids = [sse_events(r.text)[0]["id"] for r in (first, again)]
    assert data_lines(first.text, ids[0]) == data_lines(again.text, ids[1])
    assert said[1].headers["x-lanes-cache"] == "hit"
    message_ids = [r.headers["request-id"] for r in said]
    assert data_lines(said[0].text, *message_ids) == data_lines(said[1].text, *message_ids)


async def test_two_sidecars_on_one_redis_share_the_cache_and_a_redis_gone_is_a_miss(redis_server):
    """Hosts of one deployment share entries through Redis; with Redis stopped, a request is
    answered fresh (a miss), never failed by the cache."""
    shared = {"cache": ON, "state": redis_server.url, "state_namespace": "prod"}
    async with (
        open_sidecar(LOCAL, **shared) as (one, fakes_one),
        open_sidecar(LOCAL, **shared) as (two, fakes_two),
    ):
        first = await chat(one, asked())
        kept = redis.Redis.from_url(redis_server.url)
        for _ in range(200):  # written within the writer's gathering window
            if kept.zcard("lanes:{prod}:cache:order"):
                break
            await trio.sleep(0.05)
        kept.close()
        again = await chat(two, asked())
        assert again.headers["x-lanes-cache"] == "hit"
        assert fakes_two["local"].requests() == []  # the other host's answer
        redis_server.stop()
        fresh = await chat(two, asked(messages=[{"role": "user", "content": "other"}]))
    assert first.headers["x-lanes-cache"] == "miss"
    assert without_ids(again.json()) == without_ids(first.json())
    assert fresh.status_code == 200 and fresh.headers["x-lanes-cache"] == "miss"

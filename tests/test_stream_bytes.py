"""What a streamed chat completion's bytes are: the upstream's own for every chunk passed on
unchanged, a fresh encoding only where a chunk had to be rewritten; and a stream that ended well
leaves its upstream connection in the pool."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import trio

from lanes.testing import answer, raw
from sidecar import open_sidecar

MESSAGES = [{"role": "user", "content": "Say hi."}]
SSE = {"content-type": "text/event-stream"}
# spacing, key order and unescaped text no encoder of ours would produce
FIRST = (
    '{"choices":[{"delta":{"role":"assistant","content":"h\u00e9llo \u2615"},"index":0}],  '
    '"id":"c1","object":"chat.completion.chunk","model":"m"}'
)
LAST = (
    '{ "id": "c1", "object": "chat.completion.chunk", "model": "m", '
    '"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}] }'
)


async def data_lines(url: str, body: dict[str, Any]) -> list[str]:
    async with (
        httpx2.AsyncClient(trust_env=False, timeout=30) as http,
        http.stream("POST", f"{url}/chat/completions", json={**body, "stream": True}) as response,
    ):
        assert response.status_code == 200
        return [line async for line in response.aiter_lines() if line.startswith("data: ")]


async def all_lines(url: str) -> list[str]:
    """Every non-empty line of a streamed answer, comments (keep-alives) included."""
    async with (
        httpx2.AsyncClient(trust_env=False, timeout=60) as http,
        http.stream(
            "POST", f"{url}/chat/completions", json={"messages": MESSAGES, "stream": True}
        ) as response,
    ):
        return [line async for line in response.aiter_lines() if line]


USAGE = (
    '{"id":"c1","object":"chat.completion.chunk","choices":[],'
    '"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}'
)


def events(*payloads: str) -> list[bytes]:
    return [f"data: {p}\n\n".encode() for p in payloads]


async def test_unchanged_chunks_pass_through_byte_for_byte():
    """Each chunk reaches the client exactly as the upstream wrote it — its spacing, key order and
    unescaped text — then [DONE]."""
    async with open_sidecar(("local", "local", ["local-model"])) as (url, fakes):
        fakes["local"].script(
            "local-model", raw(headers=SSE, chunks=lambda: events(FIRST, LAST, "[DONE]"))
        )
        lines = await data_lines(url, {"messages": MESSAGES})
    assert lines == [f"data: {FIRST}", f"data: {LAST}", "data: [DONE]"]


async def test_a_chunk_over_several_data_lines_is_written_as_one():
    """An event whose JSON spans several `data:` lines can not go out as it came: it is encoded
    again, on one line, with the same content."""
    split = FIRST.replace('"id":', '\ndata: "id":')
    async with open_sidecar(("local", "local", ["local-model"])) as (url, fakes):
        fakes["local"].script(
            "local-model", raw(headers=SSE, chunks=lambda: events(split, LAST, "[DONE]"))
        )
        lines = await data_lines(url, {"messages": MESSAGES})
    assert len(lines) == 3 and lines[1:] == [f"data: {LAST}", "data: [DONE]"]
    assert lines[0] != f"data: {FIRST}" and json.loads(lines[0][6:]) == json.loads(FIRST)


async def test_a_usage_chunk_not_asked_for_is_withheld():
    """The usage chunk lanes asked for on a billed lane is not passed to a client that did not ask
    for it; the other chunks still pass through untouched."""
    async with open_sidecar(("local", "local", ["local-model"])) as (url, fakes):
        fakes["local"].script(
            "local-model", raw(headers=SSE, chunks=lambda: events(FIRST, LAST, USAGE, "[DONE]"))
        )
        lines = await data_lines(url, {"messages": MESSAGES})
        asked = await data_lines(
            url, {"messages": MESSAGES, "stream_options": {"include_usage": True}}
        )
    assert lines == [f"data: {FIRST}", f"data: {LAST}", "data: [DONE]"]
    assert f"data: {USAGE}" in asked


async def test_a_finished_stream_leaves_its_connection_in_the_pool():
    """After [DONE] the rest of the upstream's body is read, so its connection is kept for the next
    request rather than closed (a cut or abandoned stream still closes it)."""
    async with open_sidecar(("local", "local", ["local-model"])) as (url, fakes):
        fakes["local"].script("local-model", answer())
        for _ in range(3):
            await data_lines(url, {"messages": MESSAGES})
        await trio.sleep(0.2)
        assert fakes["local"].open_connections() == 1


async def test_silences_get_keep_alives_and_the_chunks_still_come_whole(autojump_clock):
    """While the upstream is silent the client gets a keep-alive comment every `keepalive_s`; the
    chunks either side of the silence arrive as the upstream wrote them."""
    async with open_sidecar(
        ("local", "local", ["local-model"], {"idle_s": 30.0}), server={"keepalive_s": 1.0}
    ) as (url, fakes):
        fakes["local"].script(
            "local-model",
            raw(headers=SSE, chunks=lambda: events(FIRST, LAST, "[DONE]"), chunk_delay_s=3.5),
        )
        lines = await all_lines(url)
    first, last = lines.index(f"data: {FIRST}"), lines.index(f"data: {LAST}")
    assert lines[first + 1 : last] == [": keep-alive"] * 3
    assert lines[-1] == "data: [DONE]"


async def test_a_first_read_with_nothing_to_pass_on_still_gets_keep_alives(autojump_clock):
    """The upstream's first read holds only a usage chunk the caller did not ask for: the headers
    are out, and the silence before the first content chunk carries keep-alive comments all the
    same; then the answer and [DONE]."""
    async with open_sidecar(
        ("local", "local", ["local-model"], {"idle_s": 30.0}), server={"keepalive_s": 1.0}
    ) as (url, fakes):
        fakes["local"].script(
            "local-model",
            raw(
                headers=SSE,
                chunks=lambda: [events(USAGE)[0], b"".join(events(FIRST, LAST, "[DONE]"))],
                chunk_delay_s=3.5,
            ),
        )
        lines = await all_lines(url)
    first = lines.index(f"data: {FIRST}")
    assert lines[:first] == [": keep-alive"] * 3
    data = [line for line in lines[first:] if not line.startswith(":")]
    assert data == [f"data: {FIRST}", f"data: {LAST}", "data: [DONE]"]

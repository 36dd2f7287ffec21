"""An outcome names who ended the job: an upstream that dies mid-stream while the client reads to
the end is the upstream's doing (`fault`, the word its attempt has), never `abandoned` — not even
when a recovery's answer is dropped after; `abandoned` is kept for a client that left."""

from __future__ import annotations

from typing import Any

import httpx2
import trio

from helpers import http_client
from lanes.testing import answer, stream_cut
from sidecar import open_sidecar

MESSAGES = [{"role": "user", "content": "hi"}]


async def _story(http: httpx2.AsyncClient, url: str, request_id: str) -> dict[str, Any]:
    with trio.fail_after(10):
        while True:
            story = await http.get(f"{url}/requests/{request_id}")
            if story.status_code == 200:
                return story.json()
            await trio.sleep(0.05)


async def test_an_upstream_dying_mid_stream_is_not_the_client_leaving():
    """The local server cuts its stream after three chunks; the client reads to the end: the
    story says fault, with the lane that served the chunks."""
    async with open_sidecar(("local", "local", ["local-model"])) as (url, fakes):
        fakes["local"].script("local-model", stream_cut(after=3))
        async with http_client() as http:
            async with http.stream(
                "POST", f"{url}/chat/completions", json={"messages": MESSAGES, "stream": True}
            ) as streamed:
                request_id = streamed.headers["x-lanes-request-id"]
                body = b"".join([part async for part in streamed.aiter_bytes()])
            story = await _story(http, url, request_id)
    assert b"data:" in body
    assert story["outcome"] == "fault", story
    assert story["lane"] == "local" and "abandoned" not in story["summary"], story


async def test_a_recovery_that_said_something_else_is_not_the_client_leaving():
    """The local server cuts its stream; the other local lane's regeneration says something else, so
    recovery drops it: the job ended by the upstream (`fault`), the dropped attempt `discarded` —
    neither is `abandoned` (both were: the recovery's close read as the client's)."""
    lanes = (("local", "local", ["local-model"]), ("other", "local", ["other-model"]))
    async with open_sidecar(*lanes) as (url, fakes):  # both local: FREE_LANE=off holds too
        fakes["local"].script("local-model", stream_cut(after=3))
        fakes["other"].script("other-model", answer(text="An altogether different answer."))
        async with http_client() as http:
            async with http.stream(
                "POST", f"{url}/chat/completions", json={"messages": MESSAGES, "stream": True}
            ) as streamed:
                request_id = streamed.headers["x-lanes-request-id"]
                body = b"".join([part async for part in streamed.aiter_bytes()])
            story = await _story(http, url, request_id)
    assert b"stream_interrupted" in body  # what the client was told
    outcomes = [(a["lane"], a["outcome"]) for a in story["attempt_list"]]
    assert outcomes == [("local", "fault"), ("other", "discarded")], story
    assert story["outcome"] == "fault" and story["lane"] == "local", story
    assert "abandoned" not in story["summary"]


async def test_a_client_that_leaves_mid_stream_is_still_abandoned():
    """The client stops reading after the first chunk: `abandoned`, as before."""
    async with open_sidecar(("local", "local", ["local-model"])) as (url, fakes):
        fakes["local"].script("local-model", answer(text="word " * 400, chunk_delay_s=0.01))
        async with http_client() as http:
            async with http.stream(
                "POST", f"{url}/chat/completions", json={"messages": MESSAGES, "stream": True}
            ) as streamed:
                request_id = streamed.headers["x-lanes-request-id"]
                async for _ in streamed.aiter_bytes():
                    break
            story = await _story(http, url, request_id)
    assert story["outcome"] == "abandoned", story

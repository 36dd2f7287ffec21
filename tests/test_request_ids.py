"""The job's id where each SDK reads it: `x-request-id` (the OpenAI SDK's `_request_id`) on chat,
Responses and embeddings, `request-id` (the Anthropic SDK's) on Messages — the same id as
`X-Lanes-Request-Id`, on answers, streams and errors alike."""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest

from sidecar import open_sidecar

USER: Any = [{"role": "user", "content": "Say hi"}]
CHAT_AND_EMBEDDING = {"models": [{"id": "chat"}, {"id": "emb", "embedding": True}]}


def oai(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)


def claude(url: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        base_url=url.removesuffix("/v1"), api_key="unused", max_retries=0
    )


async def test_the_openai_sdk_reads_the_request_id_on_every_door():
    """Chat, a chat stream, Responses and embeddings: the SDK's `_request_id` is the job's id,
    and so is the one an error (`APIStatusError.request_id`) carries."""
    async with open_sidecar(("local", "local", ["chat"], CHAT_AND_EMBEDDING)) as (url, fakes):
        client = oai(url)
        chat = await client.chat.completions.with_raw_response.create(model="auto", messages=USER)
        stream = await client.chat.completions.with_raw_response.create(
            model="auto", messages=USER, stream=True
        )
        async for _ in stream.parse():
            pass
        responses = await client.responses.with_raw_response.create(model="auto", input="Say hi")
        vectors = await client.embeddings.with_raw_response.create(model="emb", input="x")
        with pytest.raises(openai.APIStatusError) as refused:
            await client.embeddings.create(model="chat", input="x")  # a chat model: no vectors
    for raw in (chat, stream, responses, vectors):
        job_id = raw.headers["x-lanes-request-id"]
        assert len(job_id) == 32 and raw.request_id == job_id
    assert chat.parse()._request_id == chat.headers["x-lanes-request-id"]
    assert responses.parse()._request_id == responses.headers["x-lanes-request-id"]
    assert vectors.parse()._request_id == vectors.headers["x-lanes-request-id"]
    error_id = refused.value.response.headers["x-lanes-request-id"]
    assert refused.value.request_id == error_id and len(error_id) == 32


async def test_the_anthropic_sdk_reads_the_request_id_on_messages():
    """A message, a message stream and an error: the Anthropic SDK's request id is the job's id,
    the very one the error body's `request_id` names."""
    async with open_sidecar(("local", "local", ["chat"])) as (url, fakes):
        client = claude(url)
        raw = await client.messages.with_raw_response.create(
            model="auto", max_tokens=64, messages=USER
        )
        async with client.messages.stream(model="auto", max_tokens=64, messages=USER) as stream:
            await stream.get_final_message()
            streamed = stream.request_id, stream.response.headers["x-lanes-request-id"]
        with pytest.raises(anthropic.APIStatusError) as refused:
            await client.messages.create(model="nowhere/none", max_tokens=64, messages=USER)
    message = await raw.parse()
    assert message._request_id == raw.headers["x-lanes-request-id"] and raw.request_id
    assert "x-request-id" not in raw.headers  # Messages speaks the Anthropic API's header only
    assert streamed[0] == streamed[1] and len(streamed[0] or "") == 32
    error = refused.value
    body_id = error.body["request_id"] if isinstance(error.body, dict) else None
    assert error.request_id == error.response.headers["x-lanes-request-id"] == body_id

"""Work that can wait, through the SDKs unmodified, against `lanes serve --simulate`: the OpenAI
SDK's Files and Batch APIs (a chat batch and an embeddings batch: upload, create, poll, list,
read the output, cancel) and the Anthropic SDK's Message Batches (create, poll, results, list,
cancel). Their own sidecar process (this module's), so the free quotas their items spend are
theirs alone."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from typing import Any, TypeVar

import anthropic
import openai

from lanes.testing import ANSWER
from lanes.testing.simulate import EMBEDDING_MODEL

T = TypeVar("T")
ENDED = ("completed", "failed", "expired", "cancelled")
WITHIN_S = 120.0  # a batch item that meets a spent quota waits for its reset (a minute at most)


def polled(read: Callable[[], T], done: Callable[[T], bool], within_s: float = WITHIN_S) -> T:
    """`read()` again until `done` says so, as a user polls a batch; fails after `within_s`
    (wall-clock seconds: a real process)."""
    give_up = time.monotonic() + within_s
    while not done(seen := read()):
        assert time.monotonic() < give_up, f"not done within {within_s:g} s: {seen}"
        time.sleep(0.1)
    return seen


def jsonl(lines: list[dict[str, Any]]) -> io.BytesIO:
    return io.BytesIO("".join(json.dumps(x) + "\n" for x in lines).encode())


def chat(custom_id: str, text: str, model: str = "auto") -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": text}]}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def embedding(custom_id: str, text: str) -> dict[str, Any]:
    body = {"model": EMBEDDING_MODEL, "input": text}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings", "body": body}


def openai_client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base, api_key="sk-batch-client", max_retries=0)


def anthropic_client(base: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=base.removesuffix("/v1"), api_key="sk-batch-client", max_retries=0
    )


def output_lines(client: openai.OpenAI, file_id: str | None) -> dict[str, dict[str, Any]]:
    """An output (or error) file's lines by their custom_id."""
    assert file_id is not None
    lines = [json.loads(x) for x in client.files.content(file_id).text.splitlines() if x]
    return {x["custom_id"]: x for x in lines}


def run_openai_batch(
    client: openai.OpenAI, endpoint: Any, lines: list[dict[str, Any]]
) -> tuple[Any, dict[str, dict[str, Any]]]:
    """Upload `lines`, batch them, poll until the batch ends; the batch and its output lines."""
    file = client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    assert file.purpose == "batch" and file.bytes == len(jsonl(lines).getvalue())
    assert client.files.retrieve(file.id).id == file.id
    made = client.batches.create(input_file_id=file.id, endpoint=endpoint, completion_window="24h")
    assert made.status in ("validating", "in_progress") and made.input_file_id == file.id
    assert made.endpoint == endpoint and made.completion_window == "24h"
    done = polled(lambda: client.batches.retrieve(made.id), lambda b: b.status in ENDED)
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed) == (len(lines), len(lines))
    assert done.request_counts.failed == 0 and done.completed_at is not None
    return done, output_lines(client, done.output_file_id)


def test_openai_sdk_chat_and_embeddings_batches_round_trip(simulated):
    """files.create → batches.create → batches.retrieve until it ends → files.content: one
    output line per request, by its custom_id, each a 200 with the endpoint's own body; both
    batches in batches.list."""
    client = openai_client(simulated)
    questions = {"q1": "Weather in Paris?", "q2": "Say hi", "q3": "Name a colour"}
    done, out = run_openai_batch(
        client, "/v1/chat/completions", [chat(k, v) for k, v in questions.items()]
    )
    assert sorted(out) == sorted(questions)
    for custom_id, line in out.items():
        assert line["error"] is None and line["response"]["status_code"] == 200, line
        body = line["response"]["body"]
        assert body["object"] == "chat.completion", line
        assert body["choices"][0]["message"]["content"] == ANSWER, custom_id
    texts = {"e1": "a red apple", "e2": "a green pear"}
    vectors, embedded = run_openai_batch(
        client, "/v1/embeddings", [embedding(k, v) for k, v in texts.items()]
    )
    assert sorted(embedded) == sorted(texts)
    for line in embedded.values():
        assert line["response"]["status_code"] == 200, line
        [datum] = line["response"]["body"]["data"]
        assert datum["object"] == "embedding" and len(datum["embedding"]) > 0
        assert all(isinstance(x, float) for x in datum["embedding"])
    first, second = (embedded[k]["response"]["body"]["data"][0]["embedding"] for k in texts)
    assert first != second  # each line answered for its own input
    listed = [b.id for b in client.batches.list(limit=100)]
    assert done.id in listed and vectors.id in listed


def test_openai_sdk_batch_cancel(simulated):
    """batches.cancel on a batch whose items wait for a spent free quota: `cancelling` at once,
    then `cancelled`, every item counted, the ones never run in the error file as
    `batch_cancelled`."""
    client = openai_client(simulated)
    # gemini-flash: 5 a minute, a fifth of it left to interactive work, so however the runner
    # and the cancel interleave, most of these items can not have run when the cancel arrives
    lines = [chat(f"c{i}", f"question {i}", model="gemini/gemini-flash") for i in range(12)]
    file = client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    made = client.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    cancelling = client.batches.cancel(made.id)
    assert cancelling.id == made.id and cancelling.status in ("cancelling", "cancelled")
    done = polled(lambda: client.batches.retrieve(made.id), lambda b: b.status in ENDED)
    assert done.status == "cancelled" and done.cancelled_at is not None, done
    counts = done.request_counts
    assert counts is not None and counts.completed + counts.failed == counts.total == 12
    assert counts.failed > 0, counts
    errors = output_lines(client, done.error_file_id)
    assert len(errors) == counts.failed
    assert {x["error"]["code"] for x in errors.values()} == {"batch_cancelled"}, errors
    if counts.completed:
        served = output_lines(client, done.output_file_id)
        assert len(served) == counts.completed and not served.keys() & errors.keys()


def params(text: str, model: str = "claude-haiku-4-5") -> Any:  # the SDK's TypedDict, built plainly
    return {"model": model, "max_tokens": 256, "messages": [{"role": "user", "content": text}]}


def test_anthropic_sdk_message_batches_round_trip(simulated):
    """messages.batches.create → retrieve until `ended` → results: each request `succeeded` with
    its Messages answer; the batch in messages.batches.list."""
    client = anthropic_client(simulated)
    asked = {"one": "Weather in Paris?", "two": "Say hi", "three": "Name a colour"}
    made = client.messages.batches.create(
        requests=[{"custom_id": k, "params": params(v)} for k, v in asked.items()]
    )
    assert made.id.startswith("msgbatch_") and made.type == "message_batch"
    assert made.processing_status == "in_progress"
    counts = made.request_counts
    assert counts.processing + counts.succeeded == len(asked)
    done = polled(
        lambda: client.messages.batches.retrieve(made.id),
        lambda b: b.processing_status == "ended",
    )
    assert done.request_counts.succeeded == len(asked), done.request_counts
    assert done.request_counts.errored == done.request_counts.processing == 0
    assert done.ended_at is not None and done.results_url
    results = {r.custom_id: r.result for r in client.messages.batches.results(made.id)}
    assert sorted(results) == sorted(asked)
    for custom_id, result in results.items():
        assert result.type == "succeeded", (custom_id, result)
        message = result.message
        assert message.type == "message" and message.role == "assistant"
        assert message.stop_reason == "end_turn" and message.usage.output_tokens > 0
        assert [getattr(b, "text", None) for b in message.content] == [ANSWER], custom_id
    assert made.id in [b.id for b in client.messages.batches.list(limit=100)]


def test_anthropic_sdk_message_batch_cancel(simulated):
    """messages.batches.cancel: `canceling` at once, then `ended` with every request counted and
    the ones never run `canceled` in the results."""
    client = anthropic_client(simulated)
    # claude-opus-4-7: only OpenRouter's free model is free (8 a minute, a fifth left to
    # interactive work), so however the runner and the cancel interleave, most of these requests
    # can not have run when the cancel arrives
    made = client.messages.batches.create(
        requests=[
            {"custom_id": f"c{i}", "params": params(f"question {i}", "claude-opus-4-7")}
            for i in range(12)
        ]
    )
    cancelling = client.messages.batches.cancel(made.id)
    assert cancelling.id == made.id
    assert cancelling.processing_status in ("canceling", "ended")
    assert cancelling.cancel_initiated_at is not None
    done = polled(
        lambda: client.messages.batches.retrieve(made.id),
        lambda b: b.processing_status == "ended",
    )
    counts = done.request_counts
    assert counts.processing == 0 and counts.canceled > 0, counts
    assert counts.succeeded + counts.errored + counts.canceled + counts.expired == 12
    results = [r.result.type for r in client.messages.batches.results(made.id)]
    assert sorted(results) == sorted(
        ["succeeded"] * counts.succeeded
        + ["errored"] * counts.errored
        + ["canceled"] * counts.canceled
    )
    assert made.id in [b.id for b in client.messages.batches.list(limit=100)]

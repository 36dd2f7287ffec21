"""The floor: the least a router must do per request on our stack, and nothing more.

`python -m bench.floor PORT UPSTREAM_BASE_URL` is the limit (`bench.passthrough`) plus only the work
no router can skip: the request is read as JSON (to know its model) and written again (to name the
upstream's model), sent through the pool's transport directly (as lanes does), and the answer is
checked — a JSON answer parsed whole, each event of a stream parsed (to see its finish, usage or
error) and passed on as the upstream wrote it — and three headers say who served. No policy, no
breaker, no ledger, no journal, no Starlette. Lanes measured beside it shows what lanes' own routing
costs; the floor beside the limit shows what any router on this stack costs.

At the Messages and Responses doors a router must also translate, since the upstream speaks chat
completions: the floor translates with lanes' own pure translations (`lanes/_core/dialects/`: the
body into a chat request, the answer or each chunk of a stream back into the door's shape) and
does nothing else lanes does there — so lanes beside it shows what lanes' routing costs at every
door, not what translating costs. (Until 2026-12-04's fifth agent run the floor sent those bodies
on untranslated, and the fake upstream answered them with text: a cheaper exchange than the one
lanes has.)
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

import httpx2
import trio

from bench.passthrough import main, request_body
from lanes._core.dialects import (
    messages_api,
    messages_reply,
    responses_api,
    responses_reply,
    responses_stream,
)
from lanes._core.dialects.common import ChatRequest, compact, sse_event, written_once

HEADERS = [(b"x-served-by", b"floor"), (b"x-model", b"m"), (b"x-request-id", b"r")]


class _Door:
    """A translated door: its request as chat, and its answer and stream events from chat's."""

    def __init__(
        self,
        to_chat: Callable[[Mapping[str, Any]], ChatRequest],
        answer: Callable[[Mapping[str, Any], Mapping[str, Any]], bytes],
        events: Callable[[Mapping[str, Any], str], Any],
    ) -> None:
        self.to_chat, self.answer, self.events = to_chat, answer, events


DOORS = {
    "/v1/responses": _Door(
        responses_api.to_chat,
        lambda body, completion: compact(
            responses_reply.response_of(
                body, completion, response_id="resp_floor", created_at=time.time()
            )
        ),
        lambda body, model: responses_stream.ResponseEvents(
            body,
            response_id="resp_floor",
            created_at=time.time(),
            model=model,
            written=written_once,
        ),
    ),
    "/v1/messages": _Door(
        messages_api.to_chat,
        lambda body, completion: json.dumps(
            messages_reply.message_of(
                completion, message_id="msg_floor", model=str(body.get("model"))
            ),
            ensure_ascii=False,
            separators=(",", ":"),
        ).encode(),
        lambda body, model: messages_reply.MessageEvents(message_id="msg_floor", model=model),
    ),
}


def chat_body(chat: ChatRequest) -> dict[str, Any]:
    """The chat request sent upstream for a translated body."""
    body = {**chat.params, "model": chat.model, "messages": chat.messages}
    if chat.reasoning_effort is not None:
        body["reasoning_effort"] = chat.reasoning_effort
    if chat.stream:
        body["stream"] = True
    return body


def build(upstream: str, transport: httpx2.AsyncHTTPTransport):
    url = httpx2.URL(upstream + "/chat/completions")

    async def app(scope, receive, send):
        raw_job = await request_body(scope, receive, send)
        if raw_job is None:
            return
        job = json.loads(raw_job)
        door = DOORS.get(scope["path"])
        if door is None:
            job["model"] = str(job.get("model", ""))
            sent = job
        else:
            sent = chat_body(door.to_chat(job))
        body = json.dumps(sent, separators=(",", ":")).encode()
        request = httpx2.Request(
            "POST", url, content=body, headers={"content-type": "application/json"}
        )
        response = await transport.handle_async_request(request)
        try:
            kind = response.headers.get("content-type", "application/json")
            head = [(b"content-type", kind.encode()), *HEADERS]
            start = {"type": "http.response.start", "status": response.status_code, "headers": head}
            if not sent.get("stream"):
                raw = b"".join([part async for part in response.aiter_bytes()])
                completion = json.loads(raw)
                if door is not None and response.status_code == 200:
                    raw = door.answer(job, completion)
                await send(start)
                await send({"type": "http.response.body", "body": raw})
                return
            await send(start)
            if door is None or response.status_code != 200:
                await _relay(response, send)
            else:
                await _translated(response, send, door.events(job, sent["model"]))
        finally:
            await response.aclose()

    return app


async def _relay(response: httpx2.Response, send) -> None:
    """A stream passed on as the upstream wrote it, each event parsed."""
    rest = b""
    async for piece in response.aiter_bytes():
        events = (rest + piece).split(b"\n\n")
        rest = events.pop()
        for event in events:
            if event.startswith(b"data: ") and event[6:] != b"[DONE]":
                json.loads(event[6:])
        if events:
            out = b"\n\n".join(events) + b"\n\n"
            await send({"type": "http.response.body", "body": out, "more_body": True})
    await send({"type": "http.response.body", "body": rest, "more_body": False})


async def _translated(response: httpx2.Response, send, events: Any) -> None:
    """A chat stream as the door's events: each chunk parsed and translated as it comes."""
    rest, usage = b"", None
    opening = b"".join(sse_event(e) for e in events.start())
    await send({"type": "http.response.body", "body": opening, "more_body": True})
    async for piece in response.aiter_bytes():
        lines = (rest + piece).split(b"\n\n")
        rest = lines.pop()
        out = []
        for line in lines:
            if line.startswith(b"data: ") and line[6:] != b"[DONE]":
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
                out += [sse_event(e) for e in events.feed(chunk)]
        if out:
            await send({"type": "http.response.body", "body": b"".join(out), "more_body": True})
    ending = b"".join(sse_event(e) for e in events.finish(usage=usage))
    await send({"type": "http.response.body", "body": ending, "more_body": False})


if __name__ == "__main__":
    trio.run(main, int(sys.argv[1]), sys.argv[2], build)

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
door, not what translating costs (the floor's door cell less its chat cell shows that). Until
2026-12-04's sixth agent run the floor sent those bodies on untranslated, and the fake upstream
answered them with text: a cheaper exchange than lanes'. The translations are imported at the
first such request: a chat-only bench's floor never loads lanes.

The floor reads and writes JSON with the standard library's `json`, as issue 45 set it; with
`--msgspec` (`floor-msgspec` in `bench.agent`) with msgspec's, which lanes writes with and reads
with beneath its strict checks: the least on this stack, with no guarantee of lanes' kept.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import httpx2
import msgspec
import trio

from bench.passthrough import main, request_body

HEADERS = [(b"x-served-by", b"floor"), (b"x-model", b"m"), (b"x-request-id", b"r")]


class _Door:
    """A translated door: its request as chat, and its answer and stream events from chat's."""

    def __init__(
        self,
        to_chat: Callable[[Mapping[str, Any]], Any],
        answer: Callable[[Mapping[str, Any], Mapping[str, Any]], bytes],
        events: Callable[[Mapping[str, Any], str], Any],
        sse_event: Callable[[Mapping[str, Any]], bytes],
    ) -> None:
        self.to_chat, self.answer, self.events = to_chat, answer, events
        self.sse_event = sse_event


def _doors() -> dict[str, _Door]:
    """The translated doors, with lanes' own pure translations (imported here: at the first
    request to one, so that a floor serving chat alone never loads lanes)."""
    from lanes._core.dialects import (
        messages_api,
        messages_reply,
        responses_api,
        responses_reply,
        responses_stream,
    )
    from lanes._core.dialects.common import compact, sse_event, written_once

    return {
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
            sse_event,
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
            sse_event,
        ),
    }


TRANSLATED = ("/v1/responses", "/v1/messages")


def chat_body(chat: Any) -> dict[str, Any]:
    """The chat request sent upstream for a translated body (a `ChatRequest`): as lanes sends it
    to a model that declares no reasoning, as the bench's do."""
    body = {**chat.params, "model": chat.model, "messages": chat.messages}
    if chat.stream:
        body["stream"] = True
    return body


def build(upstream: str, transport: httpx2.AsyncHTTPTransport, *, fast: bool = False):
    """The floor's app; `fast`: JSON read and written by msgspec, not `json`."""
    url = httpx2.URL(upstream + "/chat/completions")
    loads, dumps = (msgspec.json.decode, msgspec.json.encode) if fast else (json.loads, _dumps)
    doors: dict[str, _Door] = {}

    async def app(scope, receive, send):
        raw_job = await request_body(scope, receive, send)
        if raw_job is None:
            return
        job = loads(raw_job)
        if scope["path"] in TRANSLATED and not doors:
            doors.update(_doors())
        door = doors.get(scope["path"])
        if door is None:
            job["model"] = str(job.get("model", ""))
            sent = job
        else:
            sent = chat_body(door.to_chat(job))
        body = dumps(sent)
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
                completion = loads(raw)
                if door is not None and response.status_code == 200:
                    raw = door.answer(job, completion)
                await send(start)
                await send({"type": "http.response.body", "body": raw})
                return
            await send(start)
            if door is None or response.status_code != 200:
                await _relay(response, send, loads)
            else:
                events = door.events(job, sent["model"])
                await _translated(response, send, events, door.sse_event, loads)
        finally:
            await response.aclose()

    return app


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


async def _relay(response: httpx2.Response, send, loads: Callable[[bytes], Any]) -> None:
    """A stream passed on as the upstream wrote it, each event parsed."""
    rest = b""
    async for piece in response.aiter_bytes():
        events = (rest + piece).split(b"\n\n")
        rest = events.pop()
        for event in events:
            if event.startswith(b"data: ") and event[6:] != b"[DONE]":
                loads(event[6:])
        if events:
            out = b"\n\n".join(events) + b"\n\n"
            await send({"type": "http.response.body", "body": out, "more_body": True})
    await send({"type": "http.response.body", "body": rest, "more_body": False})


async def _translated(
    response: httpx2.Response,
    send,
    events: Any,
    sse_event: Callable[[Mapping[str, Any]], bytes],
    loads: Callable[[bytes], Any],
) -> None:
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
                chunk = loads(line[6:])
                usage = chunk.get("usage") or usage
                out += [sse_event(e) for e in events.feed(chunk)]
        if out:
            await send({"type": "http.response.body", "body": b"".join(out), "more_body": True})
    ending = b"".join(sse_event(e) for e in events.finish(usage=usage))
    await send({"type": "http.response.body", "body": ending, "more_body": False})


if __name__ == "__main__":
    fast = "--msgspec" in sys.argv[3:]
    trio.run(main, int(sys.argv[1]), sys.argv[2], partial(build, fast=fast))

"""Anthropic's Message Batches, on the same durable queue as OpenAI's batches (`batches.py`):
`POST /v1/messages/batches`, `GET /v1/messages/batches[/{id}]`, `POST …/{id}/cancel`,
`GET …/{id}/results` (JSONL), `DELETE …/{id}` — so the Anthropic SDK's `messages.batches` works
unmodified. Errors are in the Messages API's shape.

A batch's requests come inline (`requests`: `custom_id` and the Messages API `params`); they are
written as the queue's input file as they are read — the body bounded by `batch.max_file_mb` —
and run like any batch item: free only, within a 24-hour window. Results are Anthropic's lines:
`succeeded` (the Messages answer), `errored` (its error body), `canceled`, `expired`.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

import trio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from lanes._core.batch.lines import MESSAGES as MESSAGES_PATH
from lanes._core.batch.queue import BatchRefused
from lanes._core.batch.runner import Batches
from lanes._core.model import strictjson
from lanes._http.batches import Streamed
from lanes._http.context import Context, caller
from lanes._http.doors import MESSAGES
from lanes._http.errors import BadRequest
from lanes._http.validation import digits

CUSTOM_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # Anthropic's rule for a request's custom_id
INLINE_MAX_BYTES = 32 * 1024 * 1024  # a Message Batch's body, at most (parsed whole)
BYTES_PER_CONTAINER = 16  # a body with more JSON objects and arrays than one per this is refused
PURPOSE = "message_batch"  # the queue's input files of Message Batches (not in /v1/files)
STATUS = {"in_progress": "in_progress", "cancelling": "canceling"}  # anything else: ended


def _batches(ctx: Context) -> Batches:
    if ctx.batches is None:
        raise BadRequest("batches are switched off here ([batch] enabled = false)", status=404,
                         code="not_found")  # fmt: skip
    return ctx.batches


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse(MESSAGES.error_body(status, message, None, None), status_code=status)


def _time(epoch: int | None) -> str | None:
    """RFC 3339, as Anthropic's batch objects carry their times."""
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, UTC).isoformat().replace("+00:00", "Z")


def _view(data: dict[str, Any], outcomes: dict[str, int], request: Request) -> dict[str, Any]:
    """A queue batch as Anthropic's `message_batch` object."""
    total = int(data["request_counts"]["total"])
    ended = data["status"] not in STATUS
    counts = {
        "succeeded": outcomes.get("ok", 0),
        "errored": outcomes.get("error", 0),
        "canceled": outcomes.get("cancelled", 0),
        "expired": outcomes.get("expired", 0),
    }
    counts["processing"] = total - sum(counts.values())
    base = str(request.base_url).rstrip("/")
    return {
        "id": data["id"],
        "type": "message_batch",
        "processing_status": STATUS.get(data["status"], "ended"),
        "request_counts": counts,
        "ended_at": _time(data.get(f"{data['status']}_at")) if ended else None,
        "created_at": _time(data["created_at"]),
        "expires_at": _time(data["expires_at"]),
        "archived_at": None,
        "cancel_initiated_at": _time(data.get("cancelling_at")),
        "results_url": f"{base}/v1/messages/batches/{data['id']}/results" if ended else None,
    }


async def _found(request: Request, ctx: Context) -> tuple[Batches, dict[str, Any]] | Response:
    batches, batch_id = _batches(ctx), request.path_params["batch_id"]
    data = await batches.call(batches.queue.batch, caller(request).client, batch_id)
    if data is None or data["endpoint"] != MESSAGES_PATH:
        return _error(404, f"no message batch {batch_id!r}")
    return batches, data


async def _shown(batches: Batches, data: dict[str, Any], request: Request) -> Response:
    outcomes = await batches.call(batches.queue.outcomes, data["id"])
    return JSONResponse(_view(data, outcomes, request))


async def create(request: Request, ctx: Context) -> Response:
    """`POST /v1/messages/batches`: the requests checked and queued, or a 400 naming the first
    bad ones (nothing runs)."""
    batches = _batches(ctx)
    queue = batches.queue
    body = await _bounded_json(request, queue.caps.max_bytes, batches)
    requests = body.get("requests") if isinstance(body, dict) else None
    if not isinstance(requests, list) or not requests:
        return _error(400, "requests: a list of {custom_id, params} is required")
    if len(requests) > queue.caps.max_lines:
        return _error(413, f"requests: more than batch.max_lines ({queue.caps.max_lines})")
    for i, one in enumerate(requests):
        if not isinstance(one, dict) or not isinstance(one.get("params"), dict):
            return _error(400, f"requests.{i}: needs custom_id and params (an object)")
        if not isinstance(one.get("custom_id"), str) or not CUSTOM_ID.match(one["custom_id"]):
            return _error(400, f"requests.{i}.custom_id: 1 to 64 of letters, digits, _ and -")
    target = queue.upload_path()
    client, now = caller(request).client, int(ctx.dispatcher.now_wall())
    made: dict[str, Any] | None = None
    try:
        await batches.parse(_write_lines, target, requests)
        file = await batches.call(
            lambda: queue.add_file(client, PURPOSE, "requests.jsonl", target, now, (PURPOSE,))
        )
        ask = {"input_file_id": file["id"], "endpoint": MESSAGES_PATH, "completion_window": "24h"}
        own = ctx.server.clients.get(client)
        budget = own.batch_max_paid_usd if own is not None else 0.0
        try:
            made = await batches.call(
                lambda: queue.create(
                    client,
                    ask,
                    now,
                    endpoints=(MESSAGES_PATH,),
                    purpose=PURPOSE,
                    prefix="msgbatch_",
                    default_budget=budget,
                )  # fmt: skip
            )
        finally:  # nothing runs from it (refused, failed): it goes — unlisted, none else could
            if made is None or made["status"] == "failed":
                with trio.CancelScope(shield=True):
                    await batches.call(queue.delete_file, client, file["id"])
    except BatchRefused as exc:
        return _error(exc.status, str(exc))
    finally:
        target.unlink(missing_ok=True)
    if made["status"] == "failed":
        bad = "; ".join(
            f"requests.{e['line'] - 1}: {e['message']}" for e in made["errors"]["data"][:5]
        )
        return _error(400, bad)
    batches.runner.wake()
    return await _shown(batches, made, request)


def _write_lines(target: Any, requests: list[dict[str, Any]]) -> None:
    with open(target, "wb") as out:
        for one in requests:
            line = {"custom_id": one["custom_id"], "method": "POST", "url": MESSAGES_PATH,
                    "body": one["params"]}  # fmt: skip
            out.write(json.dumps(line).encode() + b"\n")


async def _bounded_json(request: Request, cap: int, batches: Batches) -> Any:
    """The body as JSON, at most `cap` bytes (`INLINE_MAX_BYTES` at most: a Message Batch's
    requests come inline and are parsed whole), with at most one JSON object or array per
    `BYTES_PER_CONTAINER` bytes (what a parse holds grows with them: `[{},{},…]` took 60 times
    its size), parsed in a worker thread, one at a time (`Batches.parse`): the event loop and the
    queue's calls go on."""
    cap = min(cap, INLINE_MAX_BYTES)
    declared = digits(request.headers.get("content-length"), "Content-Length", low=0, high=10**13)
    too_large = BadRequest(f"the body is over batch.max_file_mb ({cap / 1e6:g} MB)", status=413,
                           code="body_too_large")  # fmt: skip
    if declared is not None and declared > cap:
        raise too_large
    parts, size = [], 0
    with trio.fail_after(600):
        async for part in request.stream():
            size += len(part)
            if size > cap:
                raise too_large
            parts.append(part)
    raw = b"".join(parts)
    parts.clear()
    if (raw.count(b"{") + raw.count(b"[")) * BYTES_PER_CONTAINER > max(len(raw), 4096):
        raise BadRequest("the body holds more JSON objects and arrays than a batch of requests "
                         "would", status=413, code="body_too_large")  # fmt: skip
    try:
        return await batches.parse(strictjson.loads, raw)
    except (ValueError, RecursionError):
        raise BadRequest("the request body must be one JSON object") from None


async def retrieve(request: Request, ctx: Context) -> Response:
    found = await _found(request, ctx)
    return found if isinstance(found, Response) else await _shown(*found, request)


async def listed(request: Request, ctx: Context) -> Response:
    """`GET /v1/messages/batches`: newest first, `limit` (1–1000) and `after_id`."""
    batches = _batches(ctx)
    limit = digits(request.query_params.get("limit"), "limit", low=1, high=1000) or 20
    after = (request.query_params.get("after_id") or "")[:128] or None
    client = caller(request).client
    found = await batches.call(
        lambda: batches.queue.batches(client, limit + 1, after, (MESSAGES_PATH,))
    )
    data = []
    for one in found[:limit]:
        data.append(_view(one, await batches.call(batches.queue.outcomes, one["id"]), request))
    return JSONResponse({
        "data": data, "has_more": len(found) > limit,
        "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None,
    })  # fmt: skip


async def cancel(request: Request, ctx: Context) -> Response:
    found = await _found(request, ctx)
    if isinstance(found, Response):
        return found
    batches, data = found
    now = int(ctx.dispatcher.now_wall())
    done = await batches.call(batches.queue.cancel, caller(request).client, data["id"], now)
    batches.runner.wake()
    return await _shown(batches, done or data, request)


async def results(request: Request, ctx: Context) -> Response:
    """`GET /v1/messages/batches/{id}/results`: every request's result, one JSON line each."""
    found = await _found(request, ctx)
    if isinstance(found, Response):
        return found
    batches, data = found
    if data["status"] in STATUS:
        return _error(400, f"message batch {data['id']} is still {STATUS[data['status']]}")
    chunks = await batches.call(batches.queue.results, caller(request).client, data["id"])
    if chunks is None:
        return _error(404, f"no message batch {data['id']!r}")
    return Streamed(batches, chunks, media_type="application/x-jsonl")


async def delete(request: Request, ctx: Context) -> Response:
    found = await _found(request, ctx)
    if isinstance(found, Response):
        return found
    batches, data = found
    gone = await batches.call(batches.queue.delete_batch, caller(request).client, data["id"])
    if not gone:
        return _error(400, f"message batch {data['id']} has not ended: cancel it first")
    return JSONResponse({"id": data["id"], "type": "message_batch_deleted"})

"""Work that can wait: OpenAI's Files and Batch APIs, served from the durable queue
(`_core/batch/`) and run on free capacity by its runner.

- `POST /v1/files` (multipart: `file`, `purpose=batch`), `GET /v1/files`, `GET /v1/files/{id}`,
  `GET /v1/files/{id}/content`, `DELETE /v1/files/{id}`;
- `POST /v1/batches`, `GET /v1/batches`, `GET /v1/batches/{id}`, `POST /v1/batches/{id}/cancel`.

A client sees only its own files and batches: another's id is a 404. An upload is bounded as it
arrives (`batch.max_file_mb`, `batch.max_lines`) and must name a key in `Authorization` or
`X-Api-Key` even on a sidecar without client keys — a page of another site can send a form, but
not that header. The items run as jobs that never pay (`serve_item`).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator, MutableMapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from lanes._core.batch.lines import MESSAGES as MESSAGES_PATH
from lanes._core.batch.queue import BatchQueue, BatchRefused, Caps
from lanes._core.batch.runner import Batches, BatchRunner, ItemAnswer, ServeItem
from lanes._core.batch.sqlite_queue import SQLiteBatchQueue
from lanes._core.config.schema import Config
from lanes._core.dialects.common import BadField
from lanes._core.model.candidates import Reply
from lanes._core.model.errors import JobFailed
from lanes._core.model.statuses import try_again_in
from lanes._http.context import Context, caller
from lanes._http.dialects import API
from lanes._http.doors import MESSAGES, RESPONSES, embedding_job, translated_job
from lanes._http.errors import BadRequest, error_body
from lanes._http.routes import OPENAI
from lanes._http.validation import digits, job_headers, parse_job

log = logging.getLogger("lanes")
UPLOAD_WITHIN_S = 600.0  # an upload's whole body, at most
SEND_WITHIN_S = 30.0  # a download's chunk must leave within this (a reader that stalls is let go)
MAX_LIST = 100  # a list's page, at most (OpenAI's)


def queue_folder(config: Config) -> Path | None:
    """Where the SQLite queue lives (with a Redis `state`, where uploads are written as they
    arrive): `batch.folder`, else beside the SQLite state; None when it is in memory (a temporary
    folder then)."""
    if config.batch.folder:
        return Path(os.path.expanduser(config.batch.folder))
    if config.state != ":memory:" and not config.shared_state:
        return Path(os.path.expanduser(config.state + ".batches"))
    return None


def open_queue(config: Config, folder: Path | None, scratch: Path) -> BatchQueue:
    """The queue `config` asks for: in its Redis state store (shared by every host, under its
    namespace; a server that may evict its keys is said once), else a SQLite file in `folder`
    (`scratch`, a temporary one, when None). Blocking: call it in a worker thread."""
    caps = Caps(
        max_bytes=int(config.batch.max_file_mb * 1_000_000),
        max_client_bytes=int(config.batch.max_client_mb * 1_000_000),
        max_lines=config.batch.max_lines,
        max_line_bytes=config.server.max_body_bytes,
    )
    if not config.shared_state:
        return SQLiteBatchQueue(folder or scratch, caps, durable=folder is not None)
    from lanes._core.batch.redis_queue import RedisBatchQueue

    queue = RedisBatchQueue(config.state, caps, folder or scratch, namespace=config.state_namespace)
    risk = queue.evicting()
    if risk:
        log.warning("%s", risk)
    return queue


@asynccontextmanager
async def open_batches(config: Config, dispatcher: Any) -> AsyncIterator[Batches | None]:
    """The queue and runner for `config` (None: `batch.enabled` is false); a temporary queue
    is deleted at the end."""
    if not config.batch.enabled:
        yield None
        return
    folder = queue_folder(config)
    with tempfile.TemporaryDirectory(prefix="lanes-batches-") as scratch:
        queue = await trio.to_thread.run_sync(open_queue, config, folder, Path(scratch))
        runner = BatchRunner(
            queue,
            serve_item(dispatcher, config.batch.headroom),
            now_wall=dispatcher.now_wall,
            health=dispatcher.background.task("batches"),
            concurrency=config.batch.concurrency,
            retention_s=config.batch.retention_days * 86400.0,
            interactive_waiting=lambda: dispatcher.waiting.waiting,
            backlog=dispatcher.work_left,
        )
        try:
            yield Batches(queue=queue, runner=runner)
        finally:
            queue.close()


def serve_item(dispatcher: Any, headroom: float = 0.0) -> ServeItem:
    """Serve one item as the door of its endpoint would, as a job that never pays and leaves
    `headroom` of every free quota to interactive work."""

    async def serve(
        endpoint: str,
        body: bytes,
        client: str,
        deadline_s: float,
        paid_cap: float | None = None,
    ) -> ItemAnswer:
        ms = int(min(max(deadline_s, 1.0), 3600.0) * 1000)
        headers = job_headers({"x-lanes-deadline-ms": str(ms)})
        shape = MESSAGES if endpoint == MESSAGES_PATH else OPENAI  # the item's own error shape
        try:
            return await _served(dispatcher, endpoint, body, client, headers, headroom, paid_cap)
        except (BadRequest, BadField) as exc:
            status = 400 if isinstance(exc, BadField) else exc.status
            code = "invalid_request" if isinstance(exc, BadField) else exc.code
            raw = json.dumps(shape.error_body(status, str(exc), code, exc.param)).encode()
            return ItemAnswer(status, raw, "")
        except JobFailed as exc:
            status, failed, said = shape.failed(exc)
            # "not now" only where the free capacity is known to come back (a backoff, a quota):
            # anything else is the item's answer, as OpenAI writes a failed request's
            later = try_again_in(exc)
            cost = sum(a.cost_usd for a in exc.attempts)
            return ItemAnswer(
                status, json.dumps(failed).encode(), exc.request_id or "", later, cost
            )

    return serve


async def _served(
    dispatcher: Any, endpoint: str, raw: bytes, client: str, headers: dict[str, Any],
    headroom: float, paid_cap_usd: float | None,
) -> ItemAnswer:  # fmt: skip
    # what makes an item: never paid — or, on its batch's budget, paid at most what is left
    waits: dict[str, Any] = {"free_only": paid_cap_usd is None, "headroom": headroom,
                             "paid_cap_usd": paid_cap_usd}  # fmt: skip
    if endpoint == "/v1/embeddings":
        body = json.loads(raw)
        job = attrs.evolve(embedding_job(body, client, headers), **waits)
        dispatcher.resolve(job)
        return _answer(await dispatcher.embed(job))
    translated: dict[str, API] = {MESSAGES_PATH: MESSAGES, "/v1/responses": RESPONSES}
    api = translated.get(endpoint)
    if api is not None:  # translated onto a chat job and back, as its door does
        body = json.loads(raw)
        job, _ = translated_job(api, body, client, headers, **waits)
        dispatcher.resolve(job)
        reply = await dispatcher.complete(job)
        answer = api.answer(body, reply, job, dispatcher.now_wall())
        return ItemAnswer(200, json.dumps(answer).encode(), reply.request_id, None, reply.cost_usd)
    job, _ = parse_job(raw, {}, client)
    job = attrs.evolve(job, **waits, deadline_s=headers["deadline_s"],
                       deadline_at=headers["deadline_at"])  # fmt: skip
    dispatcher.resolve(job)
    return _answer(await dispatcher.complete(job))


def _answer(reply: Reply) -> ItemAnswer:
    raw = reply.raw or json.dumps(dict(reply.body)).encode()
    return ItemAnswer(200, raw, reply.request_id, None, reply.cost_usd)


# -- the routes ------------------------------------------------------------------------------------
def _batches(ctx: Context) -> Batches:
    if ctx.batches is None:
        raise BadRequest("batches are switched off here ([batch] enabled = false)", status=404,
                         code="not_found")  # fmt: skip
    return ctx.batches


def _refused(exc: BatchRefused) -> JSONResponse:
    code = {404: "not_found", 429: "too_many"}.get(exc.status, "invalid_request")
    headers = {"Retry-After": "60"} if exc.status == 429 else {}
    body = error_body(exc.status, str(exc), code, exc.param)
    return JSONResponse(body, status_code=exc.status, headers=headers)


def _not_found(kind: str, name: str) -> JSONResponse:
    body = error_body(404, f"no {kind} {name!r}", "not_found", None)
    return JSONResponse(body, status_code=404)


def _page(request: Request) -> tuple[int, str | None]:
    limit = digits(request.query_params.get("limit"), "limit", low=1, high=MAX_LIST) or 20
    after = request.query_params.get("after") or None
    return limit, after[:128] if after else None


def _listed(items: list[dict[str, Any]], limit: int) -> JSONResponse:
    return JSONResponse({
        "object": "list", "data": items[:limit], "has_more": len(items) > limit,
        "first_id": items[0]["id"] if items else None,
        "last_id": items[: limit][-1]["id"] if items else None,
    })  # fmt: skip


async def upload_file(request: Request, ctx: Context) -> Response:
    """`POST /v1/files`: a JSONL file for a batch, written to the queue's folder as it arrives."""
    batches = _batches(ctx)
    caps = batches.queue.caps
    declared = digits(request.headers.get("content-length"), "Content-Length", low=0, high=10**13)
    too_large = f"the file is over batch.max_file_mb ({caps.max_bytes / 1e6:g} MB)"
    if declared is not None and declared > caps.max_bytes + 64 * 1024:
        raise BadRequest(too_large, "file", status=413, code="file_too_large")
    target = batches.queue.upload_path()
    try:
        with trio.fail_after(UPLOAD_WITHIN_S):
            purpose, filename = await _receive(request, target, caps.max_bytes, too_large)
        file = await batches.call(
            batches.queue.add_file, caller(request).client, purpose, filename, target,
            int(ctx.dispatcher.now_wall()),
        )  # fmt: skip
    except BatchRefused as exc:
        return _refused(exc)
    except trio.TooSlowError:
        raise BadRequest("the upload did not arrive in time", status=408,
                         code="body_timeout") from None  # fmt: skip
    finally:
        target.unlink(missing_ok=True)
    return JSONResponse(file)


async def _receive(request: Request, target: Path, cap: int, too_large: str) -> tuple[str, str]:
    """Read the multipart body (bounded as it arrives) and write its `file` part to `target`;
    its `purpose` and file name."""
    seen = 0
    receive = request.receive

    async def bounded() -> MutableMapping[str, Any]:
        nonlocal seen
        message = await receive()
        seen += len(message.get("body", b""))
        if seen > cap + 64 * 1024:
            raise BadRequest(too_large, "file", status=413, code="file_too_large")
        return message

    try:
        form = await Request(request.scope, bounded).form(max_files=1, max_fields=8)
    except (MultiPartException, HTTPException) as exc:  # said in OpenAI's shape, not as text
        raise BadRequest(f"the upload is not a valid multipart form: {exc}", "file") from None
    try:
        upload, purpose = form.get("file"), form.get("purpose")
        if upload is None or isinstance(upload, str):
            raise BadRequest("'file' must be a file part (multipart/form-data)", "file")
        if not isinstance(purpose, str):
            raise BadRequest("'purpose' is required: batch", "purpose")
        size = 0
        with target.open("wb") as out:
            while chunk := await upload.read(1 << 16):
                size += len(chunk)
                if size > cap:
                    raise BadRequest(too_large, "file", status=413, code="file_too_large")
                await trio.to_thread.run_sync(out.write, chunk)
        return purpose, upload.filename or "batch.jsonl"
    finally:
        await form.close()


async def _listing(
    request: Request, ctx: Context, read: Callable[[BatchQueue], Callable[..., list[Any]]]
) -> Response:
    """A page of the caller's own (files or batches: `read` picks the queue's lister)."""
    batches = _batches(ctx)
    limit, after = _page(request)
    found = await batches.call(read(batches.queue), caller(request).client, limit + 1, after)
    return _listed(found, limit)


async def _one(
    request: Request, ctx: Context, kind: str, read: Callable[[BatchQueue], Callable[..., Any]]
) -> Response:
    """One of the caller's own by its id (`{kind}_id` in the path), or a 404."""
    batches, name = _batches(ctx), request.path_params[f"{kind}_id"]
    found = await batches.call(read(batches.queue), caller(request).client, name)
    return _not_found(kind, name) if found is None else JSONResponse(found)


async def list_files(request: Request, ctx: Context) -> Response:
    return await _listing(request, ctx, lambda queue: queue.files)


async def get_file(request: Request, ctx: Context) -> Response:
    return await _one(request, ctx, "file", lambda queue: queue.file)


async def file_content(request: Request, ctx: Context) -> Response:
    """A file's bytes, streamed: an input file as uploaded, an output or error file from its
    batch's items."""
    batches, file_id = _batches(ctx), request.path_params["file_id"]
    chunks = await batches.call(batches.queue.content, caller(request).client, file_id)
    if chunks is None:
        return _not_found("file", file_id)
    return Streamed(batches, chunks)


class Streamed(Response):
    """A JSONL body sent as the queue reads it (never whole in memory), each chunk read in the
    queue's worker thread. Plain ASGI: Starlette's StreamingResponse left the connection held
    after its body under hypercorn's trio worker, and a graceful shutdown waited for it."""

    media_type = "application/jsonl"

    def __init__(self, batches: Batches, chunks: Iterator[bytes], media_type: str = "") -> None:
        super().__init__(media_type=media_type or self.media_type)
        self._batches, self._chunks = batches, chunks
        del self.headers["content-length"]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Each chunk must leave within `SEND_WITHIN_S`: a client that stops reading is let go
        (its connection dropped), so it can not hold a shutdown."""
        with trio.fail_after(SEND_WITHIN_S):
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        async for chunk in streamed(self._batches, self._chunks):
            with trio.fail_after(SEND_WITHIN_S):
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def streamed(batches: Batches, chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    """`chunks` (read from the queue in its worker thread) as a response body."""
    while (chunk := await batches.call(next, chunks, None)) is not None:
        yield chunk


async def delete_file(request: Request, ctx: Context) -> Response:
    batches, file_id = _batches(ctx), request.path_params["file_id"]
    if not await batches.call(batches.queue.delete_file, caller(request).client, file_id):
        return _not_found("file", file_id)
    return JSONResponse({"id": file_id, "object": "file", "deleted": True})


async def create_batch(request: Request, ctx: Context) -> Response:
    """`POST /v1/batches`: every line of the input file checked, then queued (or `failed`)."""
    from lanes._http.context import read_body
    from lanes._http.validation import json_object

    batches = _batches(ctx)
    body = json_object(await read_body(request, ctx))
    now = int(ctx.dispatcher.now_wall())
    try:
        client = caller(request).client
        own = ctx.server.clients.get(client)
        budget = own.batch_max_paid_usd if own is not None else 0.0
        made = await batches.call(
            lambda: batches.queue.create(client, body, now, default_budget=budget)
        )
    except BatchRefused as exc:
        return _refused(exc)
    batches.runner.wake()
    return JSONResponse(made)


async def list_batches(request: Request, ctx: Context) -> Response:
    return await _listing(request, ctx, lambda queue: queue.batches)


async def get_batch(request: Request, ctx: Context) -> Response:
    return await _one(request, ctx, "batch", lambda queue: queue.batch)


async def cancel_batch(request: Request, ctx: Context) -> Response:
    batches, batch_id = _batches(ctx), request.path_params["batch_id"]
    now = int(ctx.dispatcher.now_wall())
    found = await batches.call(batches.queue.cancel, caller(request).client, batch_id, now)
    batches.runner.wake()
    return _not_found("batch", batch_id) if found is None else JSONResponse(found)

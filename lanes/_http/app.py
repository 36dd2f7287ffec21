"""The sidecar's ASGI app: OpenAI's chat completions, free first, plus the operations endpoints.

Every error is OpenAI-shaped. No body, prompt or key is ever logged or echoed; a bad request names
the offending field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import trio
from starlette.applications import Starlette
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from lanes._core.dispatcher import Dispatcher
from lanes._core.model.errors import JobFailed
from lanes._core.model.job import Reply
from lanes._http.admin import Handler, admin_routes
from lanes._http.doors import Door, door_routes
from lanes._http.errors import (
    REQUEST_ID,
    BadRequest,
    error_response,
    job_failed,
    request_id_headers,
    retry_after,
)
from lanes._http.guard import Guard, Refused
from lanes._http.metrics import Metrics
from lanes._http.page import PAGE, PAGE_HEADERS
from lanes._http.running import Running
from lanes._http.state import MAX_PAGE, models_list, ready
from lanes._http.streaming import SSERelay
from lanes._http.validation import digits, job_headers, json_object, parse_job
from lanes.freetier.prices import usd_text


def reply_headers(reply: Reply, sdk_header: str = REQUEST_ID) -> dict[str, str]:
    """Who served `reply`, how and at what cost; its id also in `sdk_header`, for the SDK."""
    headers = request_id_headers(reply.request_id, sdk_header) | {
        "X-Lanes-Lane": reply.lane,
        "X-Lanes-Provider": reply.provider,
        "X-Lanes-Model": reply.model,
        "X-Lanes-Route": reply.route,
        "X-Lanes-Attempts": str(len(reply.attempts)),
        "X-Lanes-Cost-Usd": usd_text(reply.cost_usd),
    }
    return ({"X-Lanes-Explored": "1"} if reply.explored else {}) | headers


CHAT_PATH = "/v1/chat/completions"


class _Sidecar(Starlette):
    """Starlette, with one front door before its stack: `POST /v1/chat/completions` — the hot path
    — goes straight to the chat handler, past the middleware and the router (which would route it
    there, at a cost on every request). Every other request, and every other method on that path,
    is Starlette's. An exception escaping the chat handler is answered 500 as Starlette's own
    stack answers it (`ServerErrorMiddleware`, with the app's handler: an OpenAI-shaped error)."""

    def __init__(self, *, chat: ASGIApp, internal_error: Any, **options: Any) -> None:
        handlers = {**options.pop("exception_handlers", {}), Exception: internal_error}
        super().__init__(exception_handlers=handlers, **options)
        self._chat = ServerErrorMiddleware(chat, handler=internal_error)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["path"] == CHAT_PATH
            and scope["method"] == "POST"
            and not scope.get("root_path")
        ):
            scope["app"] = self
            await self._chat(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def build_app(
    dispatcher: Dispatcher,
    *,
    env: Mapping[str, str],
    metrics: Metrics | None = None,
    bind_host: str | None = None,
    running: Running | None = None,
) -> Starlette:
    """The sidecar's app over an open dispatcher (`running`: the config it runs, and under
    `--workers` which worker it is and where its parent's status is)."""
    running = running or Running()
    worker = running.worker
    server = dispatcher.config.server
    guard = Guard(server, env, bind_host=bind_host or server.host)
    metrics = metrics or Metrics(dispatcher.statistics)

    def open_route(handler: Handler) -> Handler:
        """An endpoint any loopback caller may read (liveness, metrics, the page)."""

        async def wrapped(request: Request) -> Response:
            try:
                guard.check_host(request)
            except Refused as exc:
                return error_response(exc.status, str(exc), exc.code)
            return await handler(request)

        return wrapped

    def client_of(request: Request) -> str:
        """The calling client, for the other doors: a refusal is their BadRequest."""
        try:
            return guard.sender(request).client
        except Refused as exc:
            raise BadRequest(str(exc), status=exc.status, code=exc.code) from None

    async def read_body(request: Request) -> bytes:
        """The request body, at most `max_body_bytes`, read within `body_timeout_s` (a client
        that stalls mid-body is answered 408 and let go). What was read of a refused body is let go
        before the refusal is raised: an exception kept in this frame would hold it in a reference
        cycle until the collector's next young pass, which `lanes serve` makes rare."""

        def too_large() -> BadRequest:
            limit = server.max_body_bytes
            return BadRequest(f"the body is over {limit} bytes", status=413, code="body_too_large")

        declared = digits(
            request.headers.get("content-length"), "Content-Length", low=0, high=10**12
        )
        if declared is not None and declared > server.max_body_bytes:
            raise too_large()
        parts: list[bytes] = []
        size = 0
        with trio.move_on_after(server.body_timeout_s):
            async for part in request.stream():
                size += len(part)
                if size > server.max_body_bytes:
                    parts.clear()
                    raise too_large()
                parts.append(part)
            return b"".join(parts)
        parts.clear()
        raise BadRequest(
            f"the body did not arrive within {server.body_timeout_s:g} s",
            status=408,
            code="body_timeout",
        )

    async def chat(request: Request) -> Response | SSERelay:
        try:
            client = guard.sender(request).client
            job, stream = parse_job(await read_body(request), request.headers, client)
            job_id = job.id
            dispatcher.resolve(job)  # an unknown model is a 404 before anything is sent
        except BadRequest as exc:
            return error_response(exc.status, str(exc), exc.code, param=exc.param)
        except Refused as exc:
            return error_response(exc.status, str(exc), exc.code)
        except JobFailed as exc:
            exc.request_id = exc.request_id or job_id
            status, body, headers = job_failed(exc)
            return JSONResponse(body, status_code=status, headers=headers)
        if stream:
            return SSERelay(dispatcher, job, keepalive_s=server.keepalive_s)
        try:
            reply = await dispatcher.complete(job)
        except JobFailed as exc:
            status, body, headers = job_failed(exc)
            return JSONResponse(body, status_code=status, headers=headers)
        if reply.raw:  # the upstream's own bytes, not a re-encoding of them
            return Response(reply.raw, media_type="application/json", headers=reply_headers(reply))
        return JSONResponse(dict(reply.body), headers=reply_headers(reply))

    alive = {"status": "ok"} if worker is None else {"status": "ok", "worker": worker}

    async def health(request: Request) -> Response:
        return JSONResponse(alive)

    async def is_ready(request: Request) -> Response:
        stats = dispatcher.statistics()
        serving = ready(stats)
        body: dict[str, Any] = {"ready": bool(serving), "lanes": serving}
        body["failing"] = stats.background.failing
        if (team := running.missing()) is not None:  # under --workers: is every worker serving?
            missing, count = team
            body["workers"] = {"serving": count - len(missing), "of": count, "missing": missing}
            if missing:
                body["ready"] = False
                body["reason"] = (
                    f"worker {', '.join(map(str, missing))} of {count} not serving (being "
                    "started again): the connections the kernel gives its socket wait for it"
                )
        if body["ready"]:
            return JSONResponse(body)
        return JSONResponse(body, status_code=503, headers={"Retry-After": retry_after(None)})

    async def models(request: Request) -> Response:
        """The whole list, or a cursor page of it (`?limit=N&after=ID`, as OpenAI's lists)."""
        query = request.query_params
        try:
            guard.caller(request)
            limit = digits(query.get("limit"), "limit", low=1, high=MAX_PAGE)
            page = models_list(dispatcher, after=query.get("after"), limit=limit)
        except Refused as exc:
            return error_response(exc.status, str(exc), exc.code)
        except BadRequest as exc:
            return error_response(exc.status, str(exc), exc.code, param=exc.param)
        except ValueError as exc:
            return error_response(400, str(exc), "invalid_request", param="after")
        return JSONResponse(page)

    async def prometheus(request: Request) -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)

    async def page(request: Request) -> Response:
        return HTMLResponse(PAGE, headers=PAGE_HEADERS)

    async def favicon(request: Request) -> Response:
        return Response(status_code=204)  # the page's icon is inline; this keeps logs quiet

    async def not_found(request: Request, exc: Exception) -> Response:
        return error_response(404, f"no route {request.url.path}", "not_found")

    async def method_not_allowed(request: Request, exc: Exception) -> Response:
        return error_response(
            405, f"{request.method} is not allowed on {request.url.path}", "method_not_allowed"
        )

    routes = [
        Route(CHAT_PATH, chat, methods=["POST"]),
        Route("/health", open_route(health)),
        Route("/ready", open_route(is_ready)),
        Route("/v1/models", models),
        *admin_routes(dispatcher, guard, read_body, running),
        Route("/metrics", open_route(prometheus)),
        Route("/", open_route(page)),
        Route("/favicon.ico", open_route(favicon)),
    ]
    routes += door_routes(  # the other APIs, translated onto the same jobs (see doors.py)
        Door(
            dispatcher=dispatcher,
            keepalive_s=server.keepalive_s,
            client_of=client_of,
            read_body=read_body,
            json_object=json_object,
            job_headers=job_headers,
            reply_headers=reply_headers,
        )
    )

    async def chat_door(scope: Any, receive: Receive, send: Send) -> None:
        """What Starlette's router does for the chat route: a request in, its response sent."""
        response = await chat(Request(scope, receive, send))
        await response(scope, receive, send)

    async def internal_error(request: Request, exc: Exception) -> Response:
        """A bug of ours: OpenAI-shaped, and nothing of the failure (it is in the log)."""
        message = "the sidecar failed this request; its log has the details"
        return error_response(500, message, "internal_error")

    app = _Sidecar(
        chat=chat_door,
        internal_error=internal_error,
        routes=routes,
        exception_handlers={404: not_found, 405: method_not_allowed},
    )
    app.state.metrics = metrics
    return app

"""The sidecar's ASGI app: OpenAI's chat completions, free first, the other APIs translated onto
the same jobs, and the operations endpoints — every route in one table (`ROUTES`), each behind its
door (`routes.py`).

Every error is in the route's API's shape (OpenAI's unless the Messages API's). No body, prompt or
key is ever logged or echoed; a bad request names the offending field.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from starlette.applications import Starlette
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from lanes._core.batch.runner import Batches
from lanes._core.dispatcher import Dispatcher
from lanes._http import admin, batches, doors, endpoints, message_batches
from lanes._http.context import Context
from lanes._http.errors import error_response
from lanes._http.guard import Guard
from lanes._http.metrics import Metrics, WorkCollector
from lanes._http.routes import DELETE, GET, POST, Door, Endpoint, Row, endpoint, route
from lanes._http.running import Running

CHAT_PATH = "/v1/chat/completions"
OPEN, CALLER, ADMIN, SENDER, UPLOADER = (
    Door.OPEN,
    Door.CALLER,
    Door.ADMIN,
    Door.SENDER,
    Door.UPLOADER,
)

#: Every route: its path, methods, handler and door (and, when not OpenAI's, its error shape).
CHAT = Row(CHAT_PATH, POST, endpoints.chat, SENDER)  # the hot path: straight in (`_Sidecar`)
# the other APIs, translated onto the same jobs (see doors.py): straight in too
RESPONSES = Row("/v1/responses", POST, doors.responses, SENDER, doors.RESPONSES)
MESSAGES = Row("/v1/messages", POST, doors.messages, SENDER, doors.MESSAGES)
#: The rows `_Sidecar` serves before Starlette's stack: an agent's every turn comes by one of them.
STRAIGHT = (CHAT, RESPONSES, MESSAGES)
ROUTES: tuple[Row, ...] = (
    CHAT,
    Row("/health", GET, endpoints.health, OPEN),
    Row("/ready", GET, endpoints.is_ready, OPEN),
    Row("/v1/models", GET, doors.models, CALLER),
    Row("/v1/report", GET, admin.report_view, CALLER),
    Row("/v1/forecast", GET, admin.forecast_view, CALLER),
    Row("/v1/requests/{request_id}", GET, admin.request_view, CALLER),
    Row("/v1/lanes", GET, admin.lanes_view, CALLER),
    Row("/v1/lanes/{name}/{action:str}", POST, admin.switch, ADMIN),
    Row("/v1/approvals", GET, admin.approvals, CALLER),
    Row("/v1/approvals/{approval_id}", POST, admin.decide, ADMIN),
    Row("/v1/grants", GET, admin.grants, CALLER),
    Row("/v1/grants/{grant_id}", DELETE, admin.revoke, ADMIN),
    Row("/v1/ceiling", POST, admin.ceiling, ADMIN),
    Row("/v1/reload", POST, admin.reload, ADMIN),
    Row("/v1/cache/clear", POST, admin.cache_clear, ADMIN),
    Row("/metrics", GET, endpoints.prometheus, OPEN),
    Row("/", GET, endpoints.page, OPEN),
    Row("/favicon.ico", GET, endpoints.favicon, OPEN),
    RESPONSES,
    MESSAGES,
    Row("/v1/messages/count_tokens", POST, doors.messages_count_tokens, SENDER, doors.MESSAGES),
    Row("/v1/embeddings", POST, doors.embeddings, SENDER),
    Row("/v1/models/{model_id:path}", GET, doors.model_by_id, SENDER),
    Row("/v1beta/models", GET, doors.gemini_models, CALLER, doors.GENAI),
    Row("/v1beta/models/{target:path}", GET, doors.gemini_model, CALLER, doors.GENAI),
    Row("/v1beta/models/{target:path}", POST, doors.generate_content, SENDER, doors.GENAI),
    Row("/v1/models/{target:path}", POST, doors.generate_content, SENDER, doors.GENAI),
    # work that can wait: OpenAI's Files and Batch APIs (see batches.py)
    Row("/v1/files", POST, batches.upload_file, UPLOADER),
    Row("/v1/files", GET, batches.list_files, CALLER),
    Row("/v1/files/{file_id}", GET, batches.get_file, CALLER),
    Row("/v1/files/{file_id}", DELETE, batches.delete_file, SENDER),
    Row("/v1/files/{file_id}/content", GET, batches.file_content, CALLER),
    Row("/v1/batches", POST, batches.create_batch, SENDER),
    Row("/v1/batches", GET, batches.list_batches, CALLER),
    Row("/v1/batches/{batch_id}", GET, batches.get_batch, CALLER),
    Row("/v1/batches/{batch_id}/cancel", POST, batches.cancel_batch, SENDER),
    # Anthropic's Message Batches, on the same queue (see message_batches.py)
    Row("/v1/messages/batches", POST, message_batches.create, SENDER, doors.MESSAGES),
    Row("/v1/messages/batches", GET, message_batches.listed, CALLER, doors.MESSAGES),
    Row("/v1/messages/batches/{batch_id}", GET, message_batches.retrieve, CALLER, doors.MESSAGES),
    Row("/v1/messages/batches/{batch_id}", DELETE, message_batches.delete, SENDER, doors.MESSAGES),
    Row(
        "/v1/messages/batches/{batch_id}/cancel",
        POST,
        message_batches.cancel,
        SENDER,
        doors.MESSAGES,
    ),  # fmt: skip
    Row(
        "/v1/messages/batches/{batch_id}/results",
        GET,
        message_batches.results,
        CALLER,
        doors.MESSAGES,
    ),  # fmt: skip
)


class _Sidecar(Starlette):
    """Starlette, with one front door before its stack: a `POST` to the chat completions, the
    Responses or the Messages door (`STRAIGHT`) — the hot paths — goes straight to its handler,
    past the middleware and the router (which would route it there, at a cost on every request:
    some 20 µs of CPU, measured with trivial handlers). Every other request, and every other
    method on those paths, is Starlette's. An exception escaping such a handler is answered 500 as
    Starlette's own stack answers it (`ServerErrorMiddleware`, with the app's handler: an
    OpenAI-shaped error)."""

    def __init__(
        self, *, straight: Mapping[str, Endpoint], internal_error: Any, **options: Any
    ) -> None:
        handlers = {**options.pop("exception_handlers", {}), Exception: internal_error}
        super().__init__(exception_handlers=handlers, **options)
        self._straight = {
            path: ServerErrorMiddleware(partial(_front_door, handler), handler=internal_error)
            for path, handler in straight.items()
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        door = self._straight.get(scope["path"]) if scope["type"] == "http" else None
        if door is not None and scope["method"] == "POST" and not scope.get("root_path"):
            scope["app"] = self
            await door(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


async def _front_door(handler: Endpoint, scope: Scope, receive: Receive, send: Send) -> None:
    """What Starlette's router does for a route: a request in, its response sent."""
    response = await handler(Request(scope, receive, send))
    await response(scope, receive, send)


async def not_found(request: Request, exc: Exception) -> Response:
    """No route: in Google's shape under `/v1beta/` (Gemini's clients can print no other)."""
    message = f"no route {request.url.path}"
    if request.url.path.startswith("/v1beta/"):
        body = doors.GENAI.error_body(404, message, "not_found", None)
        return JSONResponse(body, status_code=404)
    return error_response(404, message, "not_found")


async def method_not_allowed(request: Request, exc: Exception) -> Response:
    return error_response(
        405, f"{request.method} is not allowed on {request.url.path}", "method_not_allowed"
    )


async def internal_error(request: Request, exc: Exception) -> Response:
    """A bug of ours: OpenAI-shaped, and nothing of the failure (it is in the log)."""
    message = "the sidecar failed this request; its log has the details"
    return error_response(500, message, "internal_error")


def work_collector(dispatcher: Dispatcher, batches: Batches | None) -> WorkCollector:
    """`/metrics`' view of work that can wait: the batch queue and the waiting room."""
    tally = (lambda: batches.runner.tally) if batches is not None else dict
    return WorkCollector(tally, lambda: dispatcher.waiting.waiting)


def build_app(
    dispatcher: Dispatcher,
    *,
    env: Mapping[str, str],
    metrics: Metrics | None = None,
    bind_host: str | None = None,
    running: Running | None = None,
    batches: Batches | None = None,
) -> Starlette:
    """The sidecar's app over an open dispatcher (`running`: the config it runs, and under
    `--workers` which worker it is and where its parent's status is)."""
    server = dispatcher.config.server
    ctx = Context(
        dispatcher=dispatcher,
        server=server,
        guard=Guard(server, env, bind_host=bind_host or server.host),
        metrics=metrics or Metrics(dispatcher.statistics, work_collector(dispatcher, batches)),
        running=running or Running(),
        batches=batches,
    )
    app = _Sidecar(
        straight={row.path: endpoint(row, ctx) for row in STRAIGHT},
        internal_error=internal_error,
        routes=[route(row, ctx) for row in ROUTES],
        exception_handlers={404: not_found, 405: method_not_allowed},
    )
    app.state.metrics = ctx.metrics
    return app

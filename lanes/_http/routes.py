"""The one way into every handler: a row of the route table (`app.py`) says who may call the route
(`Door`) and how its refusals are said (`Shape`); `serve` checks the caller, runs the handler and
answers every refusal — the guard's, a bad request's, a job that failed before it was answered —
in the route's shape.

- `OPEN`: anyone on a loopback name (the `Host` check only): liveness, readiness, metrics, the page.
- `CALLER`: a known client (`guard.caller`), for the views; the handler reads it (`caller`).
- `ADMIN`: an admin sending JSON from no other origin (`guard.admin`); the action runs shielded from
  its client's departure (`departures.py`): a decision sent in full is made whole.
- `SENDER`: a job's sender, who may spend quota or money (`guard.sender`).
- `UPLOADER`: a sender of a file (multipart), naming its key even where none is configured
  (`guard.uploader`).

A refusal is `RequestRefused` (the guard), `BadRequest` (our checks), `BadField` (a
translation's) or a `JobFailed` the handler let through; anything else is a bug, answered 500 by
the app.

Every answer a route gives carries `PRIVATE_HEADERS`: not stored by any cache (the views hold
account data: spend, clients, prompts' stories) and never sniffed as another type than it says.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from functools import partial
from typing import NamedTuple

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from lanes._core.dialects.common import BadField
from lanes._core.model.errors import JobFailed
from lanes._core.model.statuses import LATER
from lanes._http.context import Context
from lanes._http.departures import departure_shield
from lanes._http.dialects import ChatCompletions, Shape
from lanes._http.errors import PRIVATE_HEADERS, BadRequest, retry_after
from lanes._http.guard import RequestRefused
from lanes._http.streaming import SSERelay

Handler = Callable[[Request, Context], Awaitable[Response | SSERelay]]
Endpoint = Callable[[Request], Awaitable[Response | SSERelay]]


class Door(enum.Enum):
    OPEN = "open"
    CALLER = "caller"
    ADMIN = "admin"
    SENDER = "sender"
    UPLOADER = "uploader"


OPENAI: Shape = ChatCompletions()
GET, POST, DELETE = ("GET",), ("POST",), ("DELETE",)  # a GET route answers HEAD too


class Row(NamedTuple):
    """One route (positional, so that the table reads as one: path, methods, handler, door)."""

    path: str
    methods: tuple[str, ...]
    handler: Handler
    door: Door
    shape: Shape = OPENAI


def endpoint(row: Row, ctx: Context) -> Endpoint:
    """`row`'s handler behind its door, for Starlette."""
    return partial(serve, row, ctx)


def route(row: Row, ctx: Context) -> Route:
    return Route(row.path, endpoint(row, ctx), methods=row.methods, name=row.handler.__name__)


async def serve(row: Row, ctx: Context, request: Request) -> Response | SSERelay:
    """Check `request`'s caller at `row.door`, run its handler and answer any refusal in
    `row.shape`; the answer carries `PRIVATE_HEADERS` (a stream writes its own)."""
    response = await _served(row, ctx, request)
    if isinstance(response, Response):
        response.headers.update(PRIVATE_HEADERS)
    return response


async def _served(row: Row, ctx: Context, request: Request) -> Response | SSERelay:
    guard, shape = ctx.guard, row.shape
    request = shape.incoming(request)
    try:
        match row.door:
            case Door.OPEN:
                guard.check_host(request)
            case Door.CALLER:
                request.state.caller = guard.caller(request)
            case Door.SENDER:
                request.state.caller = guard.sender(request)
            case Door.UPLOADER:
                request.state.caller = guard.uploader(request)
            case Door.ADMIN:
                request.state.caller = guard.admin(request)
                with departure_shield():
                    return await row.handler(request, ctx)
        return await row.handler(request, ctx)
    except (RequestRefused, BadRequest, BadField) as exc:
        refused = refusal(shape, exc)
        if row.door is Door.UPLOADER:  # its body may be unread: the connection is not reused
            refused.headers["connection"] = "close"
        return refused
    except JobFailed as exc:
        status, body, headers = shape.failed(exc)
        return JSONResponse(body, status_code=status, headers=headers)


def refusal(shape: Shape, exc: RequestRefused | BadRequest | BadField) -> JSONResponse:
    """A request refused before it did anything, in `shape`; a 429 or 503 with `Retry-After`."""
    status, code = (400, "invalid_request") if isinstance(exc, BadField) else (exc.status, exc.code)
    param = None if isinstance(exc, RequestRefused) else exc.param
    headers = {"Retry-After": retry_after(None)} if status in LATER else {}
    body = shape.error_body(status, str(exc), code, param)
    return JSONResponse(body, status_code=status, headers=headers)

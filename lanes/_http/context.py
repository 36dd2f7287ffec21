"""What every handler is given — one frozen `Context` per app — and what every door shares: the
bounded body read, the `X-Lanes-*` reply headers and the reply itself as a response."""

from __future__ import annotations

import attrs
import trio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from lanes._core.batch.runner import Batches
from lanes._core.config.schema import ServerConfig
from lanes._core.dispatcher import Dispatcher
from lanes._core.freetier.prices import usd_text
from lanes._core.model.candidates import Reply
from lanes._core.model.errors import JobFailed
from lanes._core.model.job import Job
from lanes._http.errors import REQUEST_ID, BadRequest, request_id_headers
from lanes._http.guard import Caller, Guard
from lanes._http.metrics import Metrics
from lanes._http.running import Running
from lanes._http.validation import digits


@attrs.frozen(kw_only=True)
class Context:
    """One app's: the open dispatcher, its `[server]` config, who may do what (`guard`), the
    metrics it renders, the config it runs (`running`), its batch queue (None: off) and the
    one-at-a-time limiter of the audit
    reports (read in a worker thread)."""

    dispatcher: Dispatcher
    server: ServerConfig
    guard: Guard
    metrics: Metrics
    running: Running
    batches: Batches | None = None
    reading: trio.CapacityLimiter = attrs.field(factory=lambda: trio.CapacityLimiter(1))


def caller(request: Request) -> Caller:
    """Who sent `request`, as its door found (`routes.py`; not at an `OPEN` door)."""
    found: Caller = request.state.caller
    return found


async def read_body(request: Request, ctx: Context) -> bytes:
    """The request body, at most `max_body_bytes`, read within `body_timeout_s` (a client that
    stalls mid-body is answered 408 and let go). Raises BadRequest (413, 408). What was read of a
    refused body is let go before the refusal is raised: an exception kept in this frame would hold
    it in a reference cycle until the collector's next young pass, which `lanes serve` makes
    rare."""
    server = ctx.server

    def too_large() -> BadRequest:
        limit = server.max_body_bytes
        return BadRequest(f"the body is over {limit} bytes", status=413, code="body_too_large")

    declared = digits(request.headers.get("content-length"), "Content-Length", low=0, high=10**12)
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


def resolve(ctx: Context, job: Job) -> None:
    """Check that `job`'s model can be routed — an unknown model is a 404 before anything is sent.
    Raises the dispatcher's `JobFailed`, carrying the job's id."""
    try:
        ctx.dispatcher.resolve(job)
    except JobFailed as exc:
        exc.told(request_id=job.id)
        raise


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
    if reply.cache is not None:
        headers["X-Lanes-Cache"] = reply.cache
        if reply.age_s is not None:
            headers["Age"] = str(int(reply.age_s))
    return ({"X-Lanes-Explored": "1"} if reply.explored else {}) | headers


def replied(reply: Reply) -> Response:
    """An OpenAI-shaped reply as it came: the upstream's own bytes, not a re-encoding of them,
    when it kept them; who served it in `X-Lanes-*`."""
    if reply.raw:
        return Response(reply.raw, media_type="application/json", headers=reply_headers(reply))
    return JSONResponse(dict(reply.body), headers=reply_headers(reply))

"""OpenAI's chat completions, free first, and what any caller reads beside them: liveness,
readiness, the model list, the metrics and the page. Each handler is `(request, ctx)` behind its
door (`routes.py`), which answers every refusal."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from lanes._http.context import Context, caller, read_body, replied, resolve
from lanes._http.errors import error_response, retry_after
from lanes._http.page import PAGE, PAGE_HEADERS
from lanes._http.state import MAX_PAGE, models_list, ready
from lanes._http.streaming import SSERelay
from lanes._http.validation import digits, parse_job


async def chat(request: Request, ctx: Context) -> Response | SSERelay:
    """`POST /v1/chat/completions`: the job served whole, or streamed (`stream: true`)."""
    job, stream = parse_job(await read_body(request, ctx), request.headers, caller(request).client)
    resolve(ctx, job)
    if stream:
        return SSERelay(ctx.dispatcher, job, keepalive_s=ctx.server.keepalive_s)
    return replied(await ctx.dispatcher.complete(job))


async def health(request: Request, ctx: Context) -> Response:
    worker = ctx.running.worker
    return JSONResponse({"status": "ok"} if worker is None else {"status": "ok", "worker": worker})


async def is_ready(request: Request, ctx: Context) -> Response:
    stats = ctx.dispatcher.statistics()
    serving = ready(stats)
    body: dict[str, Any] = {"ready": bool(serving), "lanes": serving}
    body["failing"] = stats.background.failing
    if (team := ctx.running.missing()) is not None:  # under --workers: is every worker serving?
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


async def models(request: Request, ctx: Context) -> Response:
    """The whole list, or a cursor page of it (`?limit=N&after=ID`, as OpenAI's lists)."""
    query = request.query_params
    limit = digits(query.get("limit"), "limit", low=1, high=MAX_PAGE)
    try:
        page = models_list(ctx.dispatcher, after=query.get("after"), limit=limit)
    except ValueError as exc:
        return error_response(400, str(exc), "invalid_request", param="after")
    return JSONResponse(page)


async def prometheus(request: Request, ctx: Context) -> Response:
    return Response(ctx.metrics.render(), media_type=ctx.metrics.content_type)


async def page(request: Request, ctx: Context) -> Response:
    return HTMLResponse(PAGE, headers=PAGE_HEADERS)


async def favicon(request: Request, ctx: Context) -> Response:
    return Response(status_code=204)  # the page's icon is inline; this keeps logs quiet

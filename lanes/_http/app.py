"""The sidecar's ASGI app: OpenAI's chat completions, free first, plus the operations endpoints.

Every error is OpenAI-shaped. No body, prompt or key is ever logged or echoed; a bad request names
the offending field.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Mapping

import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from lanes._core.dispatcher import Dispatcher
from lanes._core.errors import JobFailed
from lanes._core.job import Reply
from lanes._core.secrets import read_key
from lanes._http.errors import error_response, job_failed
from lanes._http.metrics import Metrics
from lanes._http.page import PAGE
from lanes._http.state import lanes_state, models_list, ready
from lanes._http.streaming import SSERelay
from lanes._http.validation import BadRequest, digits, parse_decision, parse_job, read_json

log = logging.getLogger("lanes")


def reply_headers(reply: Reply) -> dict[str, str]:
    explored = {"X-Lanes-Explored": "1"} if reply.explored else {}
    return explored | {
        "X-Lanes-Request-Id": reply.request_id,
        "X-Lanes-Lane": reply.lane,
        "X-Lanes-Provider": reply.provider,
        "X-Lanes-Model": reply.model,
        "X-Lanes-Route": reply.route,
        "X-Lanes-Attempts": str(len(reply.attempts)),
        "X-Lanes-Cost-Usd": f"{reply.cost_usd:.6f}",
    }


def client_keys(clients: Mapping[str, str], env: Mapping[str, str]) -> dict[str, str]:
    """Key → client name for `[server.clients]`; an unset or malformed key variable is one log line
    (naming the variable, never the value) and lets no one in under that name."""
    keys = {}
    for name, variable in clients.items():
        key, problem = read_key(env, variable)
        if key is None:
            log.warning("client %s: %s; its requests get 401 until it is fixed", name, problem)
        else:
            keys[key] = name
    return keys


def build_app(
    dispatcher: Dispatcher, *, env: Mapping[str, str], metrics: Metrics | None = None
) -> Starlette:
    """The sidecar's app over an open dispatcher."""
    server = dispatcher.config.server
    keys = client_keys(server.clients, env)
    metrics = metrics or Metrics()

    def client_of(request: Request) -> str:
        if not server.clients:
            return "anonymous"
        auth = request.headers.get("authorization", "")
        token = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        found = None
        for key, name in keys.items():  # compare with every key, in constant time
            if hmac.compare_digest(token.encode(), key.encode()):
                found = name
        if found is None:
            raise BadRequest("unknown client key", status=401, code="invalid_api_key")
        return found

    async def read_body(request: Request) -> bytes:
        """The request body, at most `max_body_bytes`, read within `body_timeout_s` (a client
        that stalls mid-body is answered 408 and let go)."""
        too_large = BadRequest(
            f"the body is over {server.max_body_bytes} bytes", status=413, code="body_too_large"
        )
        declared = digits(
            request.headers.get("content-length"), "Content-Length", low=0, high=10**12
        )
        if declared is not None and declared > server.max_body_bytes:
            raise too_large
        parts, size = [], 0
        with trio.move_on_after(server.body_timeout_s):
            async for part in request.stream():
                size += len(part)
                if size > server.max_body_bytes:
                    raise too_large
                parts.append(part)
            return b"".join(parts)
        raise BadRequest(
            f"the body did not arrive within {server.body_timeout_s:g} s",
            status=408,
            code="body_timeout",
        )

    async def chat(request: Request) -> Response | SSERelay:
        try:
            client = client_of(request)
            job, stream = parse_job(await read_body(request), request.headers, client)
            job_id = job.id
            dispatcher.resolve(job)  # an unknown model is a 404 before anything is sent
        except BadRequest as exc:
            return error_response(exc.status, str(exc), exc.code, param=exc.param)
        except JobFailed as exc:
            status, body, headers = job_failed(exc)
            return JSONResponse(
                body, status_code=status, headers=headers | {"X-Lanes-Request-Id": job_id}
            )
        if stream:
            return SSERelay(dispatcher, job, keepalive_s=server.keepalive_s, metrics=metrics)
        started = trio.current_time()
        try:
            reply = await dispatcher.complete(job)
        except JobFailed as exc:
            metrics.job(
                route="none",
                lane="none",
                outcome=exc.code,
                latency_s=trio.current_time() - started,
                attempts=exc.attempts,
            )
            status, body, headers = job_failed(exc)
            return JSONResponse(body, status_code=status, headers=headers)
        metrics.job(
            route=reply.route,
            lane=reply.lane,
            outcome="ok",
            latency_s=trio.current_time() - started,
            attempts=reply.attempts,
            cost=reply.cost_usd,
        )
        if reply.raw:  # the upstream's own bytes, not a re-encoding of them
            return Response(reply.raw, media_type="application/json", headers=reply_headers(reply))
        return JSONResponse(dict(reply.body), headers=reply_headers(reply))

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def is_ready(request: Request) -> Response:
        stats = dispatcher.statistics()
        serving = ready(stats)
        body = {"ready": bool(serving), "lanes": serving, "failing": stats.background.failing}
        return JSONResponse(body, status_code=200 if serving else 503)

    async def models(request: Request) -> Response:
        return JSONResponse(models_list(dispatcher, dispatcher.statistics()))

    async def lanes_view(request: Request) -> Response:
        return JSONResponse(lanes_state(dispatcher.statistics(), trio.current_time()))

    async def switch(request: Request) -> Response:
        name, action = request.path_params["name"], request.path_params["action"]
        if action not in ("off", "on"):
            return error_response(404, f"no route {request.url.path}", "not_found")
        try:
            dispatcher.lane_off(name) if action == "off" else dispatcher.lane_on(name)
        except KeyError:
            return error_response(404, f"no lane named {name!r}", "lane_not_found", param="name")
        return JSONResponse({"lane": name, "off": dispatcher.is_off(name)})

    async def approvals(request: Request) -> Response:
        return JSONResponse({"data": [dict(a) for a in dispatcher.statistics().approvals]})

    async def decide(request: Request) -> Response:
        approval_id = request.path_params["approval_id"]
        try:
            body = read_json(await read_body(request) or b"{}")
            if not isinstance(body, dict):
                raise BadRequest("the body must be a JSON object")
            decision = parse_decision(body.get("decision"))
            approval = dispatcher.approvals.decide(approval_id, decision)
        except BadRequest as exc:
            return error_response(exc.status, str(exc), exc.code, param=exc.param)
        except KeyError:
            return error_response(404, f"no pending approval {approval_id!r}", "approval_not_found")
        return JSONResponse({"id": approval.id, "decision": approval.decision})

    async def prometheus(request: Request) -> Response:
        return PlainTextResponse(
            metrics.render(dispatcher.statistics()), media_type="text/plain; version=0.0.4"
        )

    async def page(request: Request) -> Response:
        return HTMLResponse(PAGE)

    async def not_found(request: Request, exc: Exception) -> Response:
        return error_response(404, f"no route {request.url.path}", "not_found")

    async def method_not_allowed(request: Request, exc: Exception) -> Response:
        return error_response(
            405, f"{request.method} is not allowed on {request.url.path}", "method_not_allowed"
        )

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/health", health),
        Route("/ready", is_ready),
        Route("/v1/models", models),
        Route("/v1/lanes", lanes_view),
        Route("/v1/lanes/{name}/{action:str}", switch, methods=["POST"]),
        Route("/v1/approvals", approvals),
        Route("/v1/approvals/{approval_id}", decide, methods=["POST"]),
        Route("/metrics", prometheus),
        Route("/", page),
    ]
    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: method_not_allowed})
    app.state.metrics = metrics
    return app

"""The sidecar's ASGI app: OpenAI's chat completions, free first, plus the operations endpoints.

Every error is OpenAI-shaped. No body, prompt or key is ever logged or echoed; a bad request names
the offending field.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Mapping
from typing import Any, Literal

import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from lanes._core.dispatcher import Dispatcher
from lanes._core.errors import JobFailed
from lanes._core.job import Job, Privacy, Reply
from lanes._core.secrets import read_key
from lanes._http.errors import error_response, job_failed
from lanes._http.metrics import Metrics
from lanes._http.page import PAGE
from lanes._http.state import lanes_state, models_list, ready
from lanes._http.streaming import SSERelay
from lanes.freetier.headers import go_duration

log = logging.getLogger("lanes")
ROLES = {"system", "user", "assistant", "tool", "developer", "function"}
PRIVACY: dict[str, Privacy] = {"any": "any", "zdr": "zdr", "local": "local"}


class BadRequest(Exception):
    def __init__(
        self,
        message: str,
        param: str | None = None,
        status: int = 400,
        code: str = "invalid_request",
    ):
        super().__init__(message)
        self.param, self.status, self.code = param, status, code


def parse_job(raw: bytes, headers: Mapping[str, str], client: str) -> tuple[Job, bool]:
    """A Job from an OpenAI chat-completions body and our request headers. Raises BadRequest."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("the request body is not valid JSON", code="invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty array", "messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise BadRequest(f"messages[{i}] must be an object", f"messages[{i}]")
        if message.get("role") not in ROLES:
            raise BadRequest(
                f"messages[{i}].role must be one of {', '.join(sorted(ROLES))}",
                f"messages[{i}].role",
            )
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise BadRequest(
                f"messages[{i}].content must be a string or an array", f"messages[{i}].content"
            )
    model = body.get("model", "auto")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' must be a non-empty string", "model")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean", "stream")
    params = {k: v for k, v in body.items() if k not in ("messages", "model", "stream")}
    deadline_s = None
    if (raw_deadline := headers.get("x-lanes-deadline-ms")) is not None:
        if not raw_deadline.isdigit() or not 0 < int(raw_deadline) <= 3_600_000:
            raise BadRequest(
                "X-Lanes-Deadline-Ms must be whole milliseconds in 1..3600000",
                "X-Lanes-Deadline-Ms",
            )
        deadline_s = int(raw_deadline) / 1000
    privacy = headers.get("x-lanes-privacy", "any").strip().lower()
    if privacy not in PRIVACY:
        raise BadRequest("X-Lanes-Privacy must be any, zdr or local", "X-Lanes-Privacy")
    job = Job(
        messages=messages,
        params=params,
        model=model,
        deadline_s=deadline_s,
        client=client,
        cohort=headers.get("x-lanes-cohort") or None,
        request_class=headers.get("x-lanes-class") or None,
        privacy=PRIVACY[privacy],
    )
    return job, stream


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


def parse_decision(value: Any) -> Literal["once", "deny"] | float:
    """ "once", "deny", seconds, or a duration such as "1h" / "30m" (seconds returned)."""
    if value == "once":
        return "once"
    if value == "deny":
        return "deny"
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    if isinstance(value, str) and (seconds := go_duration(value)) and seconds > 0:
        return seconds
    raise BadRequest('\'decision\' must be "once", "deny" or a duration such as "1h"', "decision")


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
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > server.max_body_bytes:
            raise BadRequest(
                f"the body is over {server.max_body_bytes} bytes", status=413, code="body_too_large"
            )
        parts, size = [], 0
        async for part in request.stream():
            size += len(part)
            if size > server.max_body_bytes:
                raise BadRequest(
                    f"the body is over {server.max_body_bytes} bytes",
                    status=413,
                    code="body_too_large",
                )
            parts.append(part)
        return b"".join(parts)

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
            raw = await read_body(request)
            body = json.loads(raw or b"{}")
            if not isinstance(body, dict):
                raise BadRequest("the body must be a JSON object")
            decision = parse_decision(body.get("decision"))
            approval = dispatcher.approvals.decide(approval_id, decision)
        except BadRequest as exc:
            return error_response(exc.status, str(exc), exc.code, param=exc.param)
        except ValueError:
            return error_response(400, "the body is not valid JSON", "invalid_json")
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

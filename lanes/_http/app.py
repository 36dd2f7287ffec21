"""The sidecar's ASGI app: OpenAI's chat completions, free first, plus the operations endpoints.

Every error is OpenAI-shaped. No body, prompt or key is ever logged or echoed; a bad request names
the offending field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from lanes._core.dispatcher import Dispatcher
from lanes._core.errors import JobFailed
from lanes._core.job import Job, Privacy, Reply
from lanes._http.admin import Handler, admin_routes
from lanes._http.doors import Door, door_routes
from lanes._http.errors import BadRequest, error_response, job_failed
from lanes._http.guard import Guard, Refused
from lanes._http.metrics import Metrics
from lanes._http.page import PAGE
from lanes._http.state import models_list, ready
from lanes._http.streaming import SSERelay

ROLES = {"system", "user", "assistant", "tool", "developer", "function"}
PRIVACY: dict[str, Privacy] = {"any": "any", "zdr": "zdr", "local": "local"}


def json_object(raw: bytes) -> dict[str, Any]:
    """A request body that must be a JSON object. Raises BadRequest."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("the request body is not valid JSON", code="invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def parse_job(raw: bytes, headers: Mapping[str, str], client: str) -> tuple[Job, bool]:
    """A Job from an OpenAI chat-completions body and our request headers. Raises BadRequest."""
    body = json_object(raw)
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
    job = Job(messages=messages, params=params, model=model, client=client, **job_headers(headers))
    return job, stream


def job_headers(headers: Mapping[str, str]) -> dict[str, Any]:
    """The `Job` fields our request headers set: deadline, cohort, class, approval, the client's
    own keys, privacy. Raises BadRequest."""
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
    return {
        "deadline_s": deadline_s,
        "cohort": headers.get("x-lanes-cohort") or None,
        "request_class": headers.get("x-lanes-class") or None,
        "approval": headers.get("x-lanes-approval", "").strip()[:64] or None,
        "keys": byok_keys(headers),
        "privacy": PRIVACY[privacy],
    }


BYOK_PREFIX = "x-lanes-key-"  # X-Lanes-Key-<lane>: the client's own key for a byok lane


def byok_keys(headers: Mapping[str, str]) -> dict[str, str]:
    """The provider keys a request brings for bring-your-own-key lanes (header X-Lanes-Key-<lane>).
    Refused (400, naming the header, never the value) when one holds a control character."""
    keys = {}
    for name, value in headers.items():
        if name.lower().startswith(BYOK_PREFIX):
            lane, key = name.lower()[len(BYOK_PREFIX) :], value.strip()
            if not key or len(key) > 1024 or not key.isprintable():
                raise BadRequest(f"{name} must hold one printable key", name)
            keys[lane] = key
    return keys


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


def build_app(
    dispatcher: Dispatcher,
    *,
    env: Mapping[str, str],
    metrics: Metrics | None = None,
    bind_host: str | None = None,
) -> Starlette:
    """The sidecar's app over an open dispatcher."""
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
            client = guard.sender(request).client
            job, stream = parse_job(await read_body(request), request.headers, client)
            job_id = job.id
            dispatcher.resolve(job)  # an unknown model is a 404 before anything is sent
        except BadRequest as exc:
            return error_response(exc.status, str(exc), exc.code, param=exc.param)
        except Refused as exc:
            return error_response(exc.status, str(exc), exc.code)
        except JobFailed as exc:
            status, body, headers = job_failed(exc)
            return JSONResponse(
                body, status_code=status, headers=headers | {"X-Lanes-Request-Id": job_id}
            )
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

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def is_ready(request: Request) -> Response:
        serving = ready(dispatcher.statistics())
        return JSONResponse(
            {"ready": bool(serving), "lanes": serving}, status_code=200 if serving else 503
        )

    async def models(request: Request) -> Response:
        try:
            guard.caller(request)
        except Refused as exc:
            return error_response(exc.status, str(exc), exc.code)
        return JSONResponse(models_list(dispatcher, dispatcher.statistics()))

    async def prometheus(request: Request) -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)

    async def page(request: Request) -> Response:
        return HTMLResponse(PAGE)

    async def favicon(request: Request) -> Response:
        return Response(status_code=204)  # the page's icon is inline; this keeps logs quiet

    async def not_found(request: Request, exc: Exception) -> Response:
        return error_response(404, f"no route {request.url.path}", "not_found")

    async def method_not_allowed(request: Request, exc: Exception) -> Response:
        return error_response(
            405, f"{request.method} is not allowed on {request.url.path}", "method_not_allowed"
        )

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/health", open_route(health)),
        Route("/ready", open_route(is_ready)),
        Route("/v1/models", models),
        *admin_routes(dispatcher, guard, read_body),
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
    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: method_not_allowed})
    app.state.metrics = metrics
    return app

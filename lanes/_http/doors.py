"""The sidecar's other doors, beside chat completions (app.py):

- `POST /v1/responses` and `POST /v1/messages` (and `/v1/messages/count_tokens`): translated into
  a chat-completion `Job` (`_core/dialects/`), served by `dispatcher.complete` or streamed through
  the same recovery as chat, and translated back — every policy, header and audit rule unchanged;
- `POST /v1/embeddings`: an embedding `Job` through `dispatcher.embed` — the same lanes, tiers,
  quotas, consent and ceiling, and only ever the model the request names;
- `GET /v1/models/{id}`: one entry of the model list.

What the chat door owns — the client-key check, the bounded body read, our request headers and
the `X-Lanes-*` reply headers — it lends through `Door`, so there is one of each.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any

import attrs
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from lanes._core.dialects.common import BadField
from lanes._core.dispatcher import Dispatcher
from lanes._core.model.errors import JobFailed
from lanes._core.model.job import Job, Reply
from lanes._core.policy.needs import estimate_tokens
from lanes._http.dialects import API, MessagesAPI, ResponsesAPI
from lanes._http.errors import REQUEST_ID, BadRequest, error_response, job_failed
from lanes._http.state import model_entry
from lanes._http.streaming import SSERelay
from lanes._http.validation import chat_fields

#: OpenAI's limit on the inputs of one embeddings request.
MAX_EMBEDDING_INPUTS = 2048


@attrs.frozen(kw_only=True)
class Door:
    """What the chat door lends the others: the dispatcher, the client-key check, the
    bounded body read and its JSON reading, the `Job` fields our request headers set, and the
    reply's headers."""

    dispatcher: Dispatcher
    keepalive_s: float
    client_of: Callable[[Request], str]
    read_body: Callable[[Request], Awaitable[bytes]]
    json_object: Callable[[bytes], dict[str, Any]]
    job_headers: Callable[[Mapping[str, str]], dict[str, Any]]
    reply_headers: Callable[[Reply, str], dict[str, str]]  # and where the SDK reads the id


def door_routes(door: Door) -> list[Route]:
    responses, messages = ResponsesAPI(), MessagesAPI()
    return [
        Route("/v1/responses", partial(translated, door, responses), methods=["POST"]),
        Route("/v1/messages", partial(translated, door, messages), methods=["POST"]),
        Route("/v1/messages/count_tokens", partial(count_tokens, door, messages), methods=["POST"]),
        Route("/v1/embeddings", partial(embeddings, door), methods=["POST"]),
        Route("/v1/models/{model_id:path}", partial(model_by_id, door)),
    ]


async def _read_job(door: Door, api: API, request: Request) -> tuple[dict[str, Any], Job, bool]:
    """(the body as sent, its chat-completion job, streamed?). Raises BadRequest or BadField."""
    client = door.client_of(request)
    body = door.json_object(await door.read_body(request))
    chat = api.to_chat(body)
    job = Job(
        messages=chat_fields(chat.messages, chat.params),
        params=chat.params,
        model=chat.model,
        client=client,
        dropped=chat.dropped,
        reasoning_effort=chat.reasoning_effort,
        **door.job_headers(request.headers),
    )
    return body, job, chat.stream


async def translated(door: Door, api: API, request: Request) -> Response | SSERelay:
    """A Responses or Messages API request, served as a chat-completion job."""
    request = api.incoming(request)
    job_id = None
    try:
        body, job, stream = await _read_job(door, api, request)
        job_id = job.id
        door.dispatcher.resolve(job)  # an unknown model is a 404 before anything is sent
    except (BadRequest, BadField) as exc:
        return _refused(api, exc)
    except JobFailed as exc:
        exc.request_id = exc.request_id or job_id
        status, failure, headers = api.failed(exc)
        return JSONResponse(failure, status_code=status, headers=headers)
    now = door.dispatcher.now_wall()
    if stream:
        dialect = api.stream(body, job, now)
        return SSERelay(
            door.dispatcher,
            job,
            keepalive_s=door.keepalive_s,
            dialect=dialect,
        )
    try:
        reply = await door.dispatcher.complete(job)
    except JobFailed as exc:
        status, failure, headers = api.failed(exc)
        return JSONResponse(failure, status_code=status, headers=headers)
    headers = door.reply_headers(reply, api.request_id_header)
    return JSONResponse(api.answer(body, reply, job, now), headers=headers)


def _refused(api: API, exc: BadRequest | BadField) -> JSONResponse:
    """A request refused before routing, in `api`'s error shape."""
    status, code = (
        (exc.status, exc.code) if isinstance(exc, BadRequest) else (400, "invalid_request")
    )
    return JSONResponse(api.error_body(status, str(exc), code, exc.param), status_code=status)


async def count_tokens(door: Door, api: API, request: Request) -> Response:
    """`/v1/messages/count_tokens`: the same estimate the policy plans with (one token per four
    bytes of the messages and tools); nothing is sent upstream."""
    request = api.incoming(request)
    try:
        client = door.client_of(request)
        body = door.json_object(await door.read_body(request))
        chat = api.to_chat({"max_tokens": 1, **body})
    except (BadRequest, BadField) as exc:
        return _refused(api, exc)
    job = Job(messages=chat.messages, params=chat.params, model=chat.model, client=client)
    return JSONResponse({"input_tokens": estimate_tokens(job)})


def _embedding_job(body: Mapping[str, Any], client: str, headers: dict[str, Any]) -> Job:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' must name the embedding model", "model")
    if model == "auto":
        raise BadRequest(
            "an embedding needs a named model: 'auto' could mix models whose vectors are not "
            "comparable; name the model, a lane/model or an alias",
            "model",
        )
    value = body.get("input")
    if isinstance(value, list) and len(value) > MAX_EMBEDDING_INPUTS:
        raise BadRequest(f"'input' holds more than {MAX_EMBEDDING_INPUTS} items", "input")
    if body.get("encoding_format", "float") not in ("float", "base64"):
        raise BadRequest("'encoding_format' must be float or base64", "encoding_format")
    dimensions = body.get("dimensions")
    if dimensions is not None and (
        not isinstance(dimensions, int) or isinstance(dimensions, bool) or dimensions < 1
    ):
        raise BadRequest("'dimensions' must be a positive integer", "dimensions")
    params = {k: v for k, v in body.items() if k not in ("model", "input")}
    try:
        return Job(input=value, params=params, model=model, client=client, **headers)
    except ValueError as exc:
        raise BadRequest(str(exc), "input") from None


async def embeddings(door: Door, request: Request) -> Response:
    """`POST /v1/embeddings`: the upstream's own body, with who served it in `X-Lanes-*`."""
    job_id = None
    try:
        client = door.client_of(request)
        body = door.json_object(await door.read_body(request))
        job = _embedding_job(body, client, door.job_headers(request.headers))
        job_id = job.id
        door.dispatcher.resolve(job)
        reply = await door.dispatcher.embed(job)
    except BadRequest as exc:
        return error_response(exc.status, str(exc), exc.code, param=exc.param)
    except JobFailed as exc:
        exc.request_id = exc.request_id or job_id
        status, failure, headers = job_failed(exc)
        return JSONResponse(failure, status_code=status, headers=headers)
    if reply.raw:  # the upstream's own bytes, not a re-encoding of them
        headers = door.reply_headers(reply, REQUEST_ID)
        return Response(reply.raw, media_type="application/json", headers=headers)
    return JSONResponse(dict(reply.body), headers=door.reply_headers(reply, REQUEST_ID))


async def model_by_id(door: Door, request: Request) -> Response:
    """`GET /v1/models/{id}`: the model list's entry for `id` (`auto`, an alias or `lane/model`)."""
    try:
        door.client_of(request)
    except BadRequest as exc:
        return error_response(exc.status, str(exc), exc.code)
    model_id = request.path_params["model_id"]
    found = model_entry(door.dispatcher, model_id)
    if found is None:
        return error_response(404, f"no model {model_id!r}", "model_not_found", param="model")
    return JSONResponse(found)

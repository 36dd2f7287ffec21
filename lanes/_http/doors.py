"""The sidecar's other doors, beside chat completions (`endpoints.py`):

- `POST /v1/responses` and `POST /v1/messages` (and `/v1/messages/count_tokens`): translated into
  a chat-completion `Job` (`_core/dialects/`), served by `dispatcher.complete` or streamed through
  the same recovery as chat, and translated back — every policy, header and audit rule unchanged;
- `POST /v1/embeddings`: an embedding `Job` through `dispatcher.embed` — the same lanes, tiers,
  quotas, consent and ceiling, and only ever the model the request names;
- `GET /v1/models/{id}`: one entry of the model list;
- Gemini's API: `POST /v1beta/models/{model}:generateContent`, `:streamGenerateContent` (SSE with
  `?alt=sse`, else one JSON array) and `:countTokens` (also under `/v1/`, where google-genai
  sends them by default), `GET /v1beta/models` and `/v1beta/models/{model}`.

What every door shares is written once: the bounded body read and the `X-Lanes-*` reply headers
(`context.py`), our request headers (`validation.py`), and — at the route's door (`routes.py`) —
the client-key check and every refusal, in the API's own error shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from lanes._core.dialects import gemini_reply
from lanes._core.dialects.gemini_tools import field
from lanes._core.model.job import Job
from lanes._core.policy.needs import estimate_tokens
from lanes._http import endpoints
from lanes._http.context import Context, caller, read_body, replied, reply_headers, resolve
from lanes._http.dialects import API, GeminiAPI, GeminiCall, MessagesAPI, ResponsesAPI
from lanes._http.errors import BadRequest, error_response
from lanes._http.state import MAX_PAGE, model_entry, models_list
from lanes._http.streaming import SSERelay
from lanes._http.validation import (
    MAX_NAME,
    chat_fields,
    digits,
    job_headers,
    json_object,
    measured_object,
)

#: OpenAI's limit on the inputs of one embeddings request.
MAX_EMBEDDING_INPUTS = 2048
RESPONSES, MESSAGES, GENAI = ResponsesAPI(), MessagesAPI(), GeminiAPI()
#: Gemini's methods on a model that lanes serves: whether each streams.
GEMINI_METHODS = {"generateContent": False, "streamGenerateContent": True}


async def responses(request: Request, ctx: Context) -> Response | SSERelay:
    """`POST /v1/responses`."""
    return await translated(RESPONSES, request, ctx)


async def messages(request: Request, ctx: Context) -> Response | SSERelay:
    """`POST /v1/messages`."""
    return await translated(MESSAGES, request, ctx)


async def _read_job(api: API, request: Request, ctx: Context) -> tuple[dict[str, Any], Job, bool]:
    """(the body as sent, its chat-completion job, streamed?). Raises BadRequest or BadField."""
    raw = await read_body(request, ctx)
    body, seen = measured_object(raw)
    job, stream = translated_job(api, body, caller(request).client, job_headers(request.headers))
    return body, job.arrived(raw, plain=seen is not None and not seen.floats), stream


def translated_job(
    api: API, body: Mapping[str, Any], client: str, fields: Mapping[str, Any], **more: Any
) -> tuple[Job, bool]:
    """A Responses or Messages body as a chat-completion job (with the `Job` fields our headers
    set, and `more`), and whether it asks to be streamed. Raises BadRequest or BadField."""
    chat = api.to_chat(body)
    job = Job(
        messages=chat_fields(chat.messages, chat.params),
        params=chat.params,
        model=chat.model,
        client=client,
        dropped=chat.dropped,
        reasoning_effort=chat.reasoning_effort,
        **fields,
        **more,
    )
    return job, chat.stream


async def translated(api: API, request: Request, ctx: Context) -> Response | SSERelay:
    """A Responses or Messages API request, served as a chat-completion job."""
    body, job, stream = await _read_job(api, request, ctx)
    resolve(ctx, job)
    dispatcher = ctx.dispatcher
    now = dispatcher.now_wall()
    if stream:
        dialect = api.stream(body, job, now)
        return SSERelay(dispatcher, job, keepalive_s=ctx.server.keepalive_s, dialect=dialect)
    reply = await dispatcher.complete(job)
    headers = reply_headers(reply, api.request_id_header)
    answer = api.rendered(api.answer(body, reply, job, now))
    return Response(answer, headers=headers, media_type="application/json")


async def messages_count_tokens(request: Request, ctx: Context) -> Response:
    """`POST /v1/messages/count_tokens`: the same estimate the policy plans with (one token per
    four bytes of the messages and tools); nothing is sent upstream."""
    body = json_object(await read_body(request, ctx))
    chat = MESSAGES.to_chat({"max_tokens": 1, **body})
    client = caller(request).client
    job = Job(messages=chat.messages, params=chat.params, model=chat.model, client=client)
    return JSONResponse({"input_tokens": estimate_tokens(job)})


def embedding_job(body: Mapping[str, Any], client: str, headers: dict[str, Any]) -> Job:
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


async def embeddings(request: Request, ctx: Context) -> Response:
    """`POST /v1/embeddings`: the upstream's own body, with who served it in `X-Lanes-*`."""
    body = json_object(await read_body(request, ctx))
    job = embedding_job(body, caller(request).client, job_headers(request.headers))
    resolve(ctx, job)
    return replied(await ctx.dispatcher.embed(job))


def from_google(request: Request) -> bool:
    """Whether one of Google's SDKs sent `request`: they name themselves in `x-goog-api-client`
    (google-genai sends its `GET /v1/models…` there by default, and reads only Gemini's list)."""
    return "x-goog-api-client" in request.headers


async def models(request: Request, ctx: Context) -> Response:
    """`GET /v1/models`: OpenAI's list — Gemini's to one of Google's SDKs."""
    if from_google(request):
        return await gemini_models(request, ctx)
    return await endpoints.models(request, ctx)


async def model_by_id(request: Request, ctx: Context) -> Response:
    """`GET /v1/models/{id}`: the model list's entry for `id` (`auto`, an alias or `lane/model`);
    Gemini's description of it to one of Google's SDKs."""
    model_id = request.path_params["model_id"]
    if from_google(request):
        return _gemini_model(model_id, ctx)
    found = model_entry(ctx.dispatcher, model_id)
    if found is None:
        return error_response(404, f"no model {model_id!r}", "model_not_found", param="model")
    return JSONResponse(found)


# -- Gemini's API ----------------------------------------------------------------------------------


def _gemini_target(request: Request) -> tuple[str, str]:
    """(model, method) of `models/{model}:{method}`. Raises BadRequest (404 for a method lanes
    does not serve)."""
    model, _, method = request.path_params["target"].rpartition(":")
    if not model or len(model) > MAX_NAME:
        raise BadRequest(
            f"the path must be models/{{model}}:{{method}}, the model at most {MAX_NAME} "
            "characters",
            "model",
            status=404,
            code="not_found",
        )
    if method not in (*GEMINI_METHODS, "countTokens"):
        raise BadRequest(
            f"models/{model[:80]}:{method[:40]} is no method lanes serves (generateContent, "
            "streamGenerateContent, countTokens)",
            status=404,
            code="not_found",
        )
    return model, method


async def generate_content(request: Request, ctx: Context) -> Response | SSERelay:
    """`POST /v1beta/models/{model}:{method}` (and under `/v1/`)."""
    model, method = _gemini_target(request)
    if method == "countTokens":
        return await _gemini_count_tokens(model, request, ctx)
    sse = request.query_params.get("alt") == "sse"
    call = GeminiCall(model=model, stream=GEMINI_METHODS[method], sse=sse)
    return await translated(call, request, ctx)


async def _gemini_count_tokens(model: str, request: Request, ctx: Context) -> Response:
    """`:countTokens`: the same estimate the policy plans with, of `contents` or of a whole
    `generateContentRequest`; nothing is sent upstream."""
    body = json_object(await read_body(request, ctx))
    inner = field(body, "generateContentRequest") or body
    if not isinstance(inner, Mapping):
        raise BadRequest("generateContentRequest: must be an object", "generateContentRequest")
    chat = GeminiCall(model=model, stream=False, sse=False).to_chat(
        {k: v for k, v in inner.items() if k != "model"}
    )
    client = caller(request).client
    job = Job(messages=chat.messages, params=chat.params, model=chat.model, client=client)
    return JSONResponse({"totalTokens": estimate_tokens(job)})


async def gemini_models(request: Request, ctx: Context) -> Response:
    """`GET /v1beta/models` (`?pageSize=N&pageToken=T`): the model list as Gemini's API lists
    models — `auto`, the aliases, every lane's chat models."""
    query = request.query_params
    size = digits(query.get("pageSize"), "pageSize", low=1, high=MAX_PAGE)
    try:
        page = models_list(ctx.dispatcher, after=query.get("pageToken") or None, limit=size or 50)
    except ValueError as exc:
        raise BadRequest(str(exc).replace("after:", "pageToken:", 1), "pageToken") from None
    chat_models = [entry for entry in page["data"] if not entry.get("embedding")]
    listed: dict[str, Any] = {"models": [gemini_reply.model_of(entry) for entry in chat_models]}
    if page["has_more"]:
        listed["nextPageToken"] = page["last_id"]
    return JSONResponse(listed)


async def gemini_model(request: Request, ctx: Context) -> Response:
    """`GET /v1beta/models/{model}`: one model, as Gemini's API describes it — `auto`, an alias,
    a `lane/model`, or a model's own name (the first lane's that offers it)."""
    return _gemini_model(request.path_params["target"], ctx)


def _gemini_model(target: str, ctx: Context) -> Response:
    model_id = target.removeprefix("models/")
    found = model_entry(ctx.dispatcher, model_id) or next(
        (e for e in models_list(ctx.dispatcher)["data"] if e["id"].endswith(f"/{model_id}")), None
    )
    if found is None or found.get("embedding"):
        raise BadRequest(f"models/{model_id[:80]} is not found", status=404, code="not_found")
    return JSONResponse(gemini_reply.model_of(found))

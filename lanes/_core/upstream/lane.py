"""The shared OpenAI-compatible lane that does the work, built from one resolved `LaneSpec`.

A lane module is a few lines: `PROVIDER = Provider(...)` (`spec.py`), and optionally a `Lane`
subclass of `OpenAICompatibleLane` for quirks. Only the loader reads them. A subclass needs only
names `lanes` exports: it reads its settings from `self.spec` and rewrites what it sends in the one
documented hook, `adapt_request(body, job)`. The lane's door is `complete(job, model)` and
`open_stream(job, model)`; neither takes a timeout: the dispatcher's cancel scope bounds them.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import attrs

from lanes._core.config.schema import LaneConfig, ModelConfig
from lanes._core.freetier.kinds import CreditBased, CustomEndpoint, tier_of
from lanes._core.freetier.prices import usd_amount
from lanes._core.model.candidates import Candidate
from lanes._core.model.job import Job
from lanes._core.runtime.secrets import remember
from lanes._core.upstream.bodies import ChunkReader
from lanes._core.upstream.catalog import ModelRecord, declared_free, normalise
from lanes._core.upstream.client import Response, Upstream, encode
from lanes._core.upstream.responses import check_embeddings
from lanes._core.upstream.spec import LaneSpec
from lanes._core.upstream.spec import Provider as Provider  # where lane modules long found it

log = logging.getLogger("lanes")


#: Header names whose values are secrets (an `x-api-key`, a token), wherever config puts them.
_SECRET_HEADER = re.compile(r"(?i)authorization|api[-_]?key|token|secret|password")


def _header_secrets(headers: Mapping[str, str]) -> tuple[str, ...]:
    """The secret values among `headers` (each, and its credentials after a scheme such as
    `Bearer`), remembered for log redaction."""
    found: list[str] = []
    for name, value in headers.items():
        if _SECRET_HEADER.search(name):
            found += {value.strip(), value.strip().split(None, 1)[-1]} - {""}
    for value in found:
        remember(value)
    return tuple(found)


@attrs.frozen(repr=False)
class Secret:
    """A value that never prints."""

    value: str

    def __repr__(self) -> str:
        return "Secret('[redacted]')"

    __str__ = __repr__


#: What a candidate takes from its model's config as it is: every field the two share (but the
#: prefill flag, which the lane module's default fills in).
_AS_CONFIGURED = tuple(
    name
    for name in attrs.fields_dict(Candidate)
    if name in attrs.fields_dict(ModelConfig) and name != "prefill"
)


class OpenAICompatibleLane:
    """A lane that speaks OpenAI's chat completions at `spec.base_url`.

    Subclass it for a provider's quirks and override `adapt_request`; the loader builds the lane
    (`spec`, the key read from `spec.api_key_env`, the shared `upstream`), so a subclass need not
    define `__init__` (one that does passes its arguments on to this one).
    """

    def __init__(self, spec: LaneSpec, *, api_key: Secret | None, upstream: Upstream) -> None:
        self.spec = spec
        self.name = spec.name
        self._api_key = api_key
        self._upstream = upstream
        # what the provider's model list said last time, of the models kept
        self.catalog: tuple[ModelRecord, ...] = ()
        self._header_secrets = _header_secrets(spec.headers)
        self._said_left_out = 0  # the last `left_out` logged: one line when the cap bites anew
        self._rebuild()

    @property
    def config(self) -> LaneConfig:
        """The operator's table as written: the knobs only it sets (timeouts, breaker, limits)."""
        return self.spec.config

    def _rebuild(self) -> None:
        """Configured models first (config wins); then discovered models that are free or owned,
        at most `max_models` of them, in the catalog's order."""
        models = list(self.spec.models)
        known = {m.id for m in models}
        found = 0  # routable models the catalog adds
        for record in self.catalog:
            if record.id in known:
                continue
            model = ModelConfig(
                id=record.id,
                free=declared_free(record, self.spec.free_tier),
                context=record.context,
                max_output_tokens=record.max_output_tokens,
                input_usd_per_mtok=record.input_usd_per_mtok,
                output_usd_per_mtok=record.output_usd_per_mtok,
                tools=record.tools,
                vision=record.vision,
                json_mode=record.json_mode,
                embedding=record.embedding,
            )
            if tier_of(self.spec.free_tier, model.id, model.free) != "paid":
                found += 1
                if found <= self.config.max_models:
                    models.append(model)
        self.left_out = max(0, found - self.config.max_models)  # routable, over `max_models`
        self.models: dict[str, ModelConfig] = {m.id: m for m in models}
        self.candidates: tuple[Candidate, ...] = tuple(self._candidate(m) for m in models)

    async def refresh_catalog(self) -> int:
        """Fetch the provider's model list and take its free (or owned) models as candidates.

        Returns how many models it listed. Raises `UpstreamError` when the list can not be had.
        """
        url = f"{self.spec.base_url}{self.spec.catalog_path}"
        document = await self._upstream.get_json(
            url,
            headers=self.headers(stream=False),
            secrets=self.secrets,
            max_bytes=self.config.max_response_bytes,
        )
        catalog = normalise(self.spec.catalog_style, document, self.secrets)
        self.catalog = tuple(catalog)
        self._rebuild()
        kept = set(self.models)  # keep only the records of the models routed to (their `created`)
        self.catalog = tuple(r for r in catalog if r.id in kept)
        if self.left_out and self.left_out != self._said_left_out:
            log.warning(
                "lane %s: the catalog lists %d routable models; keeping %d (lanes.%s.max_models = "
                "%d), leaving out %d",
                self.name,
                self.config.max_models + self.left_out,
                self.config.max_models,
                self.name,
                self.config.max_models,
                self.left_out,
            )
        self._said_left_out = self.left_out
        return len(catalog)

    def _candidate(self, model: ModelConfig) -> Candidate:
        spec = self.spec
        return Candidate(
            lane=self.name,
            model=model.id,
            tier="byok" if self.config.byok else tier_of(spec.free_tier, model.id, model.free),
            prefill=model.prefill if model.prefill is not None else spec.prefill,
            cap_param=spec.output_cap,
            billing_switches=spec.billing_switches,
            tool_prompt_tokens=spec.tool_prompt_tokens,
            **{name: getattr(model, name) for name in _AS_CONFIGURED},
        )

    @property
    def secrets(self) -> tuple[str, ...]:
        """What an upstream's words are redacted of: the lane's key, and the values of secret
        headers its config adds."""
        return ((self._api_key.value,) if self._api_key else ()) + self._header_secrets

    def key_for(self, job: Job | None) -> str | None:
        """The key a request uses: a bring-your-own-key lane's comes with the job, and only that
        job's; any other lane's is the one its key variable held."""
        if self.config.byok:
            return job.keys.get(self.name) if job is not None else None
        return self._api_key.value if self._api_key else None

    def secrets_for(self, job: Job | None) -> tuple[str, ...]:
        """The secrets an answer to `job`'s request may echo: the key it is sent with (the job's
        own, on a bring-your-own-key lane) and the lane's secret headers."""
        key = self.key_for(job)
        return ((key,) if key else ()) + self._header_secrets

    def headers(self, *, stream: bool, job: Job | None = None) -> dict[str, str]:
        headers = dict(self.spec.headers)
        headers["Accept"] = "text/event-stream" if stream else "application/json"
        if key := self.key_for(job):
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def adapt_request(self, body: dict[str, Any], job: Job) -> dict[str, Any]:
        """The hook for a provider's quirks: the chat completions body about to be sent for `job`
        (streamed or not, `body["model"]` the model), returned as the provider wants it. This one
        returns it unchanged. Keep the caller's params, and add no parameter the provider bills
        beyond the request (its `billing_switches`): they have been taken out for a reason."""
        return body

    def request_body(self, job: Job, model: str, *, stream: bool) -> dict[str, Any]:
        """The body sent upstream: the job's own, through `adapt_request` (given copies of the
        messages to change, when a lane module has a hook of its own)."""
        shared = type(self).adapt_request is OpenAICompatibleLane.adapt_request
        return self.adapt_request(job.body(model, stream=stream, shared=shared), job)

    def encoded_body(self, job: Job, model: str, *, stream: bool) -> bytes:
        """`request_body` as the bytes sent, encoded once for the job, this lane, the model and
        the stream switch: a retry of the same attempt sends the very bytes again. Without a hook
        of the lane module's own, a plain translated request's messages and tools are those
        encoded when it arrived (`Job.body_bytes`)."""

        def make() -> bytes:
            if type(self).adapt_request is OpenAICompatibleLane.adapt_request:
                spliced = job.body_bytes(model, stream=stream)
                if spliced is not None:
                    return spliced
            return encode(self.request_body(job, model, stream=stream), plain=job.plain)

        return job.encoded((self, model, stream), make)

    async def complete(
        self, job: Job, model: str, *, sent: Callable[[], None] | None = None
    ) -> Response:
        """`sent`: called once the request has left (see `Upstream.post_json`)."""
        return await self._upstream.post_json(
            f"{self.spec.base_url}/chat/completions",
            headers=self.headers(stream=False, job=job),
            body=self.encoded_body(job, model, stream=False),
            secrets=self.secrets_for(job),
            max_bytes=self.config.max_response_bytes,
            sent=sent,
        )

    async def embed(self, job: Job, model: str) -> Response:
        """POST an embedding job to `{base_url}/embeddings`; its body is the job's own, untouched
        (`input`, `dimensions`, `encoding_format`, ...)."""
        return await self._upstream.post_json(
            f"{self.spec.base_url}/embeddings",
            headers=self.headers(stream=False, job=job),
            body=job.body(model),
            secrets=self.secrets_for(job),
            check=check_embeddings,
            max_bytes=self.config.max_response_bytes,
        )

    def balance_endpoint(self) -> CustomEndpoint | None:
        """Where to read the remaining credit, when the kind says the provider or an endpoint
        knows."""
        kind = self.spec.free_tier
        if not isinstance(kind, CreditBased) or kind.detection == "local":
            return None
        endpoint = kind.endpoint if kind.detection == "custom" else self.spec.balance
        if endpoint is None:
            return None
        return attrs.evolve(endpoint, url=endpoint.url.replace("{base_url}", self.spec.base_url))

    async def fetch_balance(self) -> float | None:
        """The remaining USD the balance endpoint reports, or None when it has no usable figure."""
        endpoint = self.balance_endpoint()
        if endpoint is None:
            return None
        headers = {**self.headers(stream=False), **endpoint.headers}
        document = await self._upstream.get_json(
            endpoint.url, headers=headers, secrets=self.secrets, max_bytes=64 * 1024
        )
        value: Any = document
        for part in endpoint.json_path.split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        return usd_amount(value) if isinstance(value, (int, float)) else None  # bounded

    @asynccontextmanager
    async def open_stream(
        self, job: Job, model: str, *, sent: Callable[[], None] | None = None
    ) -> AsyncIterator[ChunkReader]:
        async with self._upstream.open_stream(
            f"{self.spec.base_url}/chat/completions",
            headers=self.headers(stream=True, job=job),
            body=self.encoded_body(job, model, stream=True),
            secrets=self.secrets_for(job),
            max_event_bytes=self.config.max_event_bytes,
            sent=sent,
        ) as reader:
            yield reader

"""What a finished job's trace holds, and where it goes. Pure: values in, values out.

A job is one span; each attempt it sent is a child, and so is each wait for a paid-fallback
approval. They are built from the job's record after it ends — never on the way — with the times
the record kept (trio's clock, turned into epoch nanoseconds by one pair of readings taken when
the job ended). Names and attributes follow the OpenTelemetry GenAI semantic conventions
(Development status; https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-spans/ and
open-telemetry/semantic-conventions-genai model/gen-ai/spans.yaml): the span name is
`{gen_ai.operation.name} {gen_ai.request.model}`, with `gen_ai.operation.name` (`chat`,
`embeddings`), `gen_ai.provider.name`, `gen_ai.request.model`, `gen_ai.response.model`,
`gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens`, and `error.type` on failure. What only
`lanes` knows goes under `lanes.*`.

No span holds a message, an input, an answer, an upstream's error text or a key: only names,
counts, codes, times and the reasons the router itself wrote.
"""

from __future__ import annotations

# lanes: pure
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

import attrs

from lanes._core.config.schema import TelemetryConfig
from lanes._core.freetier.prices import usage_tokens
from lanes._core.model.candidates import Attempt, Candidate
from lanes._core.model.errors import ConfigError
from lanes._core.model.record import JobRecord
from lanes._core.model.traceparent import TraceParent, parse

Value = str | bool | int | float | tuple[str, ...]
Kind = Literal["server", "client", "internal"]
ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
SERVICE_ENV = "OTEL_SERVICE_NAME"
TRACES_PATH = "/v1/traces"
MAX_TEXT = 256  # characters of one attribute's text (a model name, a skip reason)
MAX_SKIPS = 32  # skip reasons listed on a job's span; the rest are counted


@attrs.frozen(kw_only=True)
class Target:
    """Where traces go: the OTLP/HTTP traces URL, the service's name, the bounds."""

    url: str
    service_name: str
    queue_size: int
    export_timeout_s: float


def target(config: TelemetryConfig, env: Mapping[str, str]) -> Target | None:
    """Where `config` (else the standard variables in `env`) sends traces; None: nowhere. Raises
    `ConfigError` naming the variable when one is set but wrong (its value is not shown)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    base, service = config.otlp_endpoint, config.service_name
    if base is None:
        base = env.get(ENDPOINT_ENV, "").strip() or None
        if base is None:
            return None
        _check(ENDPOINT_ENV, otlp_endpoint=base)
    if service is None:
        service = env.get(SERVICE_ENV, "").strip() or "lanes"
        _check(SERVICE_ENV, service_name=service)
    base = base.rstrip("/")
    url = base if base.endswith(TRACES_PATH) else base + TRACES_PATH
    return Target(
        url=url,
        service_name=service,
        queue_size=config.queue_size,
        export_timeout_s=config.export_timeout_s,
    )


def _check(name: str, *, otlp_endpoint: str | None = None, service_name: str | None = None) -> None:
    try:
        TelemetryConfig(otlp_endpoint=otlp_endpoint, service_name=service_name)
    except ValueError as exc:
        rule = str(exc).partition(";")[2].strip() or "see the [telemetry] keys"
        raise ConfigError(f"{name}: not a valid value; {rule}", key=name) from None


@attrs.frozen(kw_only=True)
class SpanFact:
    """One span to export: times in epoch nanoseconds; `parent` is the index of its parent in
    the trace (None: the job's own span, child of the caller's `traceparent` if any)."""

    name: str
    kind: Kind
    start_ns: int
    end_ns: int
    attributes: Mapping[str, Value]
    error: str | None = None  # error.type, and the span's status is an error
    parent: int | None = None


@attrs.frozen(kw_only=True)
class JobTrace:
    parent: TraceParent | None
    spans: tuple[SpanFact, ...]


def _text(value: str) -> str:
    return value if len(value) <= MAX_TEXT else value[: MAX_TEXT - 1] + "…"


def _tokens(usage: object) -> dict[str, Value]:
    counted = usage_tokens(usage)
    if counted is None:
        return {}
    return {"gen_ai.usage.input_tokens": counted[0], "gen_ai.usage.output_tokens": counted[1]}


def job_trace(
    record: JobRecord,
    outcome: str,
    *,
    ended_wall: float,
    ended_at: float,
    served: Candidate | None,
    route: str | None,
    usage: object,
    provider_of: Callable[[str], str],
) -> JobTrace:
    """The spans of `record`'s job, which ended with `outcome` ("ok" or an error's code) at
    `ended_at` on trio's clock, `ended_wall` epoch seconds; `served`: the candidate that
    answered; `provider_of(lane)`: the lane's provider."""
    job = record.job

    def ns(at: float) -> int:
        return max(0, int((ended_wall - (ended_at - at)) * 1e9))

    operation = "embeddings" if job.embedding else "chat"
    started = ns(record.started_at)
    ended = max(started, ns(ended_at))
    ok = outcome == "ok"
    attributes: dict[str, Value] = {
        "gen_ai.operation.name": operation,
        "gen_ai.request.model": _text(job.model),
        "lanes.request_id": job.id,
        "lanes.client": _text(job.client),
        "lanes.request_class": _text(record.request_class),
        "lanes.privacy": record.privacy,
        "lanes.outcome": _text(outcome),
        "lanes.attempts": len(record.attempts),
        "lanes.cost_usd": sum(a.cost_usd for a in record.attempts),
    }
    if job.cohort:
        attributes["lanes.cohort"] = _text(job.cohort)
    if route:
        attributes["lanes.route"] = route
    if record.approval:
        attributes["lanes.approval"] = record.approval
    if served is not None and ok:
        attributes["gen_ai.provider.name"] = _text(provider_of(served.lane))
        attributes["gen_ai.response.model"] = _text(served.model)
        attributes["lanes.lane"] = served.lane
        attributes.update(_tokens(usage))
    skips = [f"{s.lane}/{s.model}: {s.reason}" for s in record.all_skips()]
    if skips:
        attributes["lanes.skip_reasons"] = tuple(_text(s) for s in skips[:MAX_SKIPS])
        attributes["lanes.skips"] = len(skips)
    root = SpanFact(
        name=_text(f"{operation} {job.model}"),
        kind="server",
        start_ns=started,
        end_ns=ended,
        attributes=attributes,
        error=None if ok else _text(outcome),
    )
    children = [
        *_attempts(record.attempts, operation, served, usage, ns, started, ended, provider_of),
        *(
            SpanFact(
                name="lanes approval wait",
                kind="internal",
                start_ns=min(max(started, ns(since)), ended),
                end_ns=min(max(started, ns(until)), ended),
                attributes={"lanes.approval.id": _text(approval)},
                parent=0,
            )
            for since, until, approval in record.waits
        ),
    ]
    return JobTrace(parent=parse(job.traceparent), spans=(root, *children))


def _attempts(
    attempts: Sequence[Attempt],
    operation: str,
    served: Candidate | None,
    usage: object,
    ns: Callable[[float], int],
    started: int,
    ended: int,
    provider_of: Callable[[str], str],
) -> list[SpanFact]:
    """One span per attempt; one recorded without its start (by an older writer) is placed
    after the one before it."""
    spans, after = [], started
    for attempt in attempts:
        begin = ns(attempt.started_at) if attempt.started_at is not None else after
        begin = min(max(started, begin), ended)
        end = min(max(begin, begin + int(attempt.duration_s * 1e9)), ended)
        after = end
        ok = attempt.outcome == "ok"
        attributes: dict[str, Value] = {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": _text(provider_of(attempt.lane)),
            "gen_ai.request.model": _text(attempt.model),
            "lanes.lane": attempt.lane,
            "lanes.tier": attempt.tier,
            "lanes.route": attempt.route,
            "lanes.outcome": attempt.outcome,
            "lanes.retry": attempt.retry,
            "lanes.cost_usd": attempt.cost_usd,
        }
        if attempt.status is not None:
            attributes["http.response.status_code"] = attempt.status
        if ok:
            attributes["gen_ai.response.model"] = _text(attempt.model)
            if served is not None and attempt.key == served.key:
                attributes.update(_tokens(usage))
        spans.append(
            SpanFact(
                name=_text(f"{operation} {attempt.model}"),
                kind="client",
                start_ns=begin,
                end_ns=end,
                attributes=attributes,
                error=None if ok else _text(attempt.category or attempt.outcome),
                parent=0,
            )
        )
    return spans

"""Traces out: each finished job's spans (`tracing.py`) handed to OpenTelemetry's SDK and sent over
OTLP/HTTP to a collector. This module imports OpenTelemetry (the `otel` extra); `open.py` imports
it only when a collector is configured, so without one no OpenTelemetry code is loaded at all.

Off the request path: the journal drops a finished job's spans into a bounded queue (`note`,
which never waits); a background task (`run`) hands them to the SDK's `BatchSpanProcessor`, whose
own thread batches and exports them. A dead or slow collector costs nothing but drops, counted
under `spans` in the task health (`lanes_dropped{queue="spans"}` on `/metrics`): a job whose
spans find the queue full, and every span an export could not deliver (after the exporter's
retries, within `export_timeout_s`). The task `telemetry` is failing while the collector takes
nothing.

Nothing is propagated: no global tracer provider is installed, no client is instrumented, and no
request to a provider carries a trace header.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import trio
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)

from lanes._core.audit.tracing import MAX_TEXT, JobTrace, Target
from lanes._core.runtime.tasks import TaskHealth

QUEUE = "spans"
_KINDS = {"server": SpanKind.SERVER, "client": SpanKind.CLIENT, "internal": SpanKind.INTERNAL}
SCHEDULE_DELAY_MS = 1000  # how long the SDK's thread waits to fill a batch
ACCOUNT_EVERY_S = 1.0  # how often the task reads what the exporter delivered and lost


class _Counting(SpanExporter):
    """The OTLP exporter, counting the spans it delivered and those it could not. Called from
    the SDK's export thread; read from trio's."""

    def __init__(self, inner: SpanExporter) -> None:
        self._inner = inner
        self._lock = threading.Lock()
        self.delivered = 0
        self.lost = 0
        self.failing = False  # the last export delivered nothing

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self._inner.export(spans)
        except Exception:  # an exporter that raises loses its batch: counted, never fatal
            result = SpanExportResult.FAILURE
        with self._lock:
            if result is SpanExportResult.SUCCESS:
                self.delivered += len(spans)
                self.failing = False
            else:
                self.lost += len(spans)
                self.failing = True
        return result

    def counts(self) -> tuple[int, int, bool]:
        with self._lock:
            return self.delivered, self.lost, self.failing

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._inner.force_flush(timeout_millis)


class Telemetry:
    """One dispatcher's traces. `note` from the journal, `run` in the dispatcher's nursery,
    `aclose` when it closes."""

    def __init__(self, target: Target, health: TaskHealth) -> None:
        self.target = target
        self._health = health
        self._send, self._receive = trio.open_memory_channel[JobTrace](target.queue_size)
        self._exporter = _Counting(
            OTLPSpanExporter(endpoint=target.url, timeout=target.export_timeout_s)
        )
        self._provider = TracerProvider(
            resource=Resource.create({"service.name": target.service_name}),
            span_limits=SpanLimits(max_span_attribute_length=MAX_TEXT * 4),
            shutdown_on_exit=False,  # `aclose` shuts it down, within a bound
        )
        self._provider.add_span_processor(
            BatchSpanProcessor(
                self._exporter,
                max_queue_size=target.queue_size,
                schedule_delay_millis=SCHEDULE_DELAY_MS,
                max_export_batch_size=min(512, target.queue_size),
            )
        )
        self._tracer = self._provider.get_tracer("lanes")
        self._handed = 0  # spans handed to the SDK
        self._reported_lost = 0  # of the exporter's losses, those already counted as dropped
        self._reported_delivered = 0

    def note(self, job: JobTrace) -> None:
        """Queue a finished job's spans; when the queue is full (or closed), drop and count them.
        Never waits."""
        try:
            self._send.send_nowait(job)
        except (trio.WouldBlock, trio.ClosedResourceError):
            self._health.dropped(QUEUE, len(job.spans))

    async def run(self) -> None:
        """Hand queued spans to the SDK, and count what its exports lost; until cancelled."""
        while True:
            with trio.move_on_after(ACCOUNT_EVERY_S):
                self._hand(await self._receive.receive())
            self._account()

    async def aclose(self) -> None:
        """Export what is left and stop the SDK's thread, within the export timeout (shielded:
        a closing dispatcher still sends its last jobs' spans)."""
        with trio.CancelScope(shield=True), trio.move_on_after(self.target.export_timeout_s + 1):
            self._drain()
            self._send.close()
            await trio.to_thread.run_sync(self._provider.shutdown, abandon_on_cancel=True)
        self._account()

    def _drain(self) -> None:
        while True:
            try:
                self._hand(self._receive.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                return

    def _hand(self, job: JobTrace) -> None:
        """Start and end `job`'s spans at their recorded times. When they would overflow the
        SDK's queue (the collector is behind), they are dropped here and counted."""
        delivered, lost, _ = self._exporter.counts()
        if self._handed - delivered - lost + len(job.spans) > self.target.queue_size:
            self._health.dropped(QUEUE, len(job.spans))
            return
        context = None
        if job.parent is not None:
            caller = SpanContext(
                trace_id=job.parent.trace_id,
                span_id=job.parent.span_id,
                is_remote=True,
                trace_flags=TraceFlags(job.parent.flags),
            )
            context = trace.set_span_in_context(NonRecordingSpan(caller))
        spans: list[Span] = []
        for fact in job.spans:
            parent = context
            if fact.parent is not None:
                parent = trace.set_span_in_context(spans[fact.parent])
            attributes = dict(fact.attributes)
            if fact.error is not None:
                attributes["error.type"] = fact.error
            span = self._tracer.start_span(
                fact.name,
                context=parent,
                kind=_KINDS[fact.kind],
                attributes=attributes,
                start_time=fact.start_ns,
            )
            if fact.error is not None:
                span.set_status(Status(StatusCode.ERROR, fact.error))
            spans.append(span)  # type: ignore[arg-type]  # the SDK's tracer makes SDK spans
        self._handed += sum(1 for span in spans if span.is_recording())  # sampled out: not sent
        for span, fact in reversed(list(zip(spans, job.spans, strict=True))):
            span.end(end_time=fact.end_ns)

    def _account(self) -> None:
        delivered, lost, failing = self._exporter.counts()
        self._health.dropped(QUEUE, lost - self._reported_lost)
        if failing and lost > self._reported_lost:
            self._health.failed(
                ConnectionError("the collector took no spans"), "spans not delivered"
            )
        elif delivered > self._reported_delivered:
            self._health.ok()
        self._reported_lost, self._reported_delivered = lost, delivered

"""OpenTelemetry traces: one span per job, one per attempt, under the caller's `traceparent`, sent
as real OTLP/HTTP protobuf to a collector on 127.0.0.1 — and nothing at all without one."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx2
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

import lanes
from helpers import config, local_lane, paid_lane
from lanes._core.audit.tracing import Target, job_trace, target
from lanes._core.config.schema import TelemetryConfig
from lanes._core.model.clocks import TrioTime
from lanes._core.model.job import Job
from lanes._core.model.record import JobRecord
from lanes._core.model.traceparent import normalised, parse
from lanes.harness.configs import CLIENT_KEY, FREE_KEY, PAID_KEY
from lanes.testing import open_fake, status
from sidecar import open_sidecar

PROMPT = "Recite the secret pangram Zq8-Vx3-Lm7 backwards."
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CALLER_SPAN}-01"
# one fault opens the local lane's breaker: no same-candidate retry, the paid lane is next
ONE_STRIKE = {"failures": 1, "cooldown_s": 600, "jitter": 0}
ANSWER = {
    "id": "chatcmpl-capture",
    "object": "chat.completion",
    "created": 1,
    "model": "paid-model",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
}


class _Server:
    """An HTTP server on 127.0.0.1 in a thread, keeping every POST's headers and body."""

    def __init__(self, reply: bytes, content_type: str) -> None:
        self.posts: list[tuple[dict[str, str], bytes]] = []
        posts = self.posts

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                posts.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(200)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)

    def __enter__(self) -> _Server:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.shutdown()
        self._http.server_close()


@pytest.fixture
def collector() -> Iterator[_Server]:
    """An OTLP/HTTP collector: answers every export with an empty ExportTraceServiceResponse."""
    with _Server(ExportTraceServiceResponse().SerializeToString(), "application/x-protobuf") as c:
        yield c


@pytest.fixture
def provider() -> Iterator[_Server]:
    """An OpenAI-compatible upstream that answers every request, and keeps its headers."""
    with _Server(json.dumps(ANSWER).encode(), "application/json") as p:
        yield p


def _value(any_value: Any) -> Any:
    which = any_value.WhichOneof("value")
    if which == "array_value":
        return tuple(_value(v) for v in any_value.array_value.values)
    return getattr(any_value, which)


def received(collector: _Server) -> list[dict[str, Any]]:
    """Every span the collector was sent, decoded from the OTLP protobuf payloads."""
    spans = []
    for headers, body in collector.posts:
        assert headers["content-type"] == "application/x-protobuf"
        request = ExportTraceServiceRequest.FromString(body)
        for resource in request.resource_spans:
            service = {a.key: _value(a.value) for a in resource.resource.attributes}
            for scope in resource.scope_spans:
                for span in scope.spans:
                    spans.append(
                        {
                            "name": span.name,
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent": span.parent_span_id.hex(),
                            "kind": span.kind,
                            "start": span.start_time_unix_nano,
                            "end": span.end_time_unix_nano,
                            "status": span.status.code,
                            "attributes": {a.key: _value(a.value) for a in span.attributes},
                            "service": service["service.name"],
                        }
                    )
    return spans


def check_fallback_trace(spans: list[dict[str, Any]], collector: _Server) -> None:
    """One job span under the caller's span, two attempt children (the local lane's 503, then the
    paid lane's answer) with the GenAI and lanes attributes; no prompt and no key anywhere."""
    assert len(spans) == 3, "\n".join(str((s["name"], s["attributes"])) for s in spans)
    (job,) = [s for s in spans if s["parent"] == CALLER_SPAN]
    attempts = sorted((s for s in spans if s["parent"] == job["span_id"]), key=lambda s: s["start"])
    assert len(attempts) == 2
    assert {s["trace_id"] for s in spans} == {TRACE_ID}
    assert job["name"] == "chat auto" and job["service"] == "lanes-test"
    assert job["attributes"]["gen_ai.operation.name"] == "chat"
    assert job["attributes"]["gen_ai.request.model"] == "auto"
    assert job["attributes"]["gen_ai.response.model"] == "paid-model"
    assert job["attributes"]["gen_ai.provider.name"] == "openai_compatible"
    assert job["attributes"]["gen_ai.usage.input_tokens"] == 11
    assert job["attributes"]["gen_ai.usage.output_tokens"] == 7
    assert job["attributes"]["lanes.route"] == "paid_fallback"
    assert job["attributes"]["lanes.lane"] == "paid"
    assert job["attributes"]["lanes.cohort"] == "nightly"
    assert job["attributes"]["lanes.attempts"] == 2
    assert job["attributes"]["lanes.cost_usd"] > 0
    assert len(job["attributes"]["lanes.request_id"]) == 32
    assert "error.type" not in job["attributes"]
    failed, served = attempts
    assert failed["name"] == "chat local-model" and served["name"] == "chat paid-model"
    assert failed["kind"] == served["kind"] == 3  # SPAN_KIND_CLIENT
    assert failed["attributes"]["error.type"] == "server_error"
    assert failed["attributes"]["http.response.status_code"] == 503
    assert failed["attributes"]["lanes.route"] == "local"
    assert failed["status"] == 2  # STATUS_CODE_ERROR
    assert served["attributes"]["gen_ai.provider.name"] == "openai_compatible"
    assert served["attributes"]["gen_ai.request.model"] == "paid-model"
    assert served["attributes"]["gen_ai.usage.output_tokens"] == 7
    assert served["attributes"]["lanes.tier"] == "paid"
    assert served["attributes"]["lanes.cost_usd"] > 0
    assert "error.type" not in served["attributes"]
    for span in attempts:
        assert job["start"] <= span["start"] <= span["end"] <= job["end"]
    assert failed["end"] <= served["start"]
    texts = [s["name"] for s in spans] + [
        str(v) for s in spans for value in s["attributes"].values() for v in _flat(value)
    ]
    for secret in (PROMPT, "Zq8-Vx3-Lm7", PAID_KEY, FREE_KEY, CLIENT_KEY):
        assert all(secret not in text for text in texts)
        assert all(secret.encode() not in body for _, body in collector.posts)


def _flat(value: Any) -> tuple[Any, ...]:
    return value if isinstance(value, tuple) else (value,)


def _telemetry(url: str, **more: Any) -> dict[str, Any]:
    return {"otlp_endpoint": url, "service_name": "lanes-test", "export_timeout_s": 2, **more}


async def test_a_fallback_through_lanes_serve_is_one_job_span_with_two_attempt_spans(
    collector, provider
):
    """Through `lanes serve`: the local lane fails, the paid one serves; the collector receives
    the job's span as a child of the caller's `traceparent` and one child per attempt, and the
    provider's request carries no trace header."""
    async with open_sidecar(
        ("local", "local", ["local-model"], {"breaker": ONE_STRIKE}),
        ("paid", "paid", ["paid-model"], {"base_url": f"{provider.url}/v1"}),
        telemetry=_telemetry(collector.url),
    ) as (url, fakes):
        fakes["local"].script("local-model", status(503))
        headers = {"traceparent": TRACEPARENT, "x-lanes-cohort": "nightly"}
        body = {"messages": [{"role": "user", "content": PROMPT}]}
        async with httpx2.AsyncClient(trust_env=False, timeout=10) as http:
            reply = await http.post(f"{url}/chat/completions", json=body, headers=headers)
    assert reply.status_code == 200, reply.text
    check_fallback_trace(received(collector), collector)
    ((sent, _),) = provider.posts
    assert not {"traceparent", "tracestate", "baggage"} & set(sent)


async def test_a_fallback_through_the_library_is_traced_under_the_callers_traceparent(
    collector, provider, env
):
    """Through `open_dispatcher`: the same trace, from a job that carries `traceparent`."""
    async with open_fake("local", models=("local-model",)) as local:
        local.script("local-model", status(503))
        cfg = config(
            local_lane("local", local.base_url, breaker=ONE_STRIKE),
            paid_lane("paid", f"{provider.url}/v1"),
            telemetry=_telemetry(collector.url),
        )
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
            job = lanes.Job(
                messages=[{"role": "user", "content": PROMPT}],
                cohort="nightly",
                traceparent=TRACEPARENT,
            )
            reply = await dispatcher.complete(job)
    assert reply.lane == "paid"
    check_fallback_trace(received(collector), collector)
    assert dispatcher.background.statistics().dropped.get("spans", 0) == 0


async def test_a_streamed_job_is_traced_too(collector, env):
    """A streamed job's span and its attempt's, once the stream is over, with the usage it
    reported."""
    async with open_fake("local", models=("local-model",)) as local:
        cfg = config(local_lane("local", local.base_url), telemetry=_telemetry(collector.url))
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
            job = lanes.Job(
                messages=[{"role": "user", "content": PROMPT}],
                params={"stream_options": {"include_usage": True}},
                traceparent=TRACEPARENT,
            )
            async with dispatcher.open_stream(job) as stream:
                assert [chunk async for chunk in stream]
    spans = received(collector)
    (job_span,) = [s for s in spans if s["parent"] == CALLER_SPAN]
    (attempt,) = [s for s in spans if s["parent"] == job_span["span_id"]]
    assert job_span["attributes"]["lanes.route"] == "local", job_span["attributes"]
    assert job_span["attributes"]["gen_ai.usage.output_tokens"] > 0
    assert attempt["name"] == "chat local-model" and attempt["attributes"]["lanes.outcome"] == "ok"
    assert all(PROMPT not in str(v) for s in spans for v in s["attributes"].values())


async def test_a_dead_collector_costs_only_counted_drops(provider, env):
    """No one listens at the endpoint: the job is answered all the same, and its three spans are
    counted as dropped (`lanes_dropped{queue="spans"}`)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    async with open_fake("local", models=("local-model",)) as local:
        local.script("local-model", status(503))
        cfg = config(
            local_lane("local", local.base_url, breaker=ONE_STRIKE),
            paid_lane("paid", f"{provider.url}/v1"),
            telemetry=_telemetry(dead, export_timeout_s=0.5),
        )
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
            reply = await dispatcher.complete(
                lanes.Job(messages=[{"role": "user", "content": "hi"}])
            )
    assert reply.lane == "paid"
    background = dispatcher.background.statistics()
    assert background.dropped["spans"] == 3
    assert "telemetry" in background.failing


async def test_a_malformed_traceparent_is_ignored_not_refused(collector, provider):
    """A `traceparent` that is not W3C's: the request is served, and its job starts a trace of
    its own."""
    async with open_sidecar(
        ("paid", "paid", ["paid-model"], {"base_url": f"{provider.url}/v1"}),
        telemetry=_telemetry(collector.url),
    ) as (url, _):
        body = {"messages": [{"role": "user", "content": "hi"}]}
        headers = {"traceparent": f"00-{TRACE_ID.upper()}-{CALLER_SPAN}-01"}
        async with httpx2.AsyncClient(trust_env=False, timeout=10) as http:
            reply = await http.post(f"{url}/chat/completions", json=body, headers=headers)
    assert reply.status_code == 200, reply.text
    (job,) = [s for s in received(collector) if s["kind"] == 2]  # SPAN_KIND_SERVER
    assert job["parent"] == "" and job["trace_id"] != TRACE_ID


@pytest.mark.slow  # a fresh interpreter
def test_without_a_collector_no_opentelemetry_module_is_loaded():
    """`import lanes`, a dispatcher opened and a job served (and failed) without an endpoint:
    `opentelemetry` is never imported."""
    code = """
import sys, trio, lanes
cfg = lanes.load_config({"lanes": [{"name": "local", "module": "openai_compatible",
    "base_url": "http://127.0.0.1:9/v1", "api_key_env": "", "free_tier": {"kind": "local"},
    "models": [{"id": "m"}]}]}, env={})
async def main():
    async with lanes.open_dispatcher(cfg, env={}) as dispatcher:
        try:
            await dispatcher.complete(lanes.Job(messages=[{"role": "user", "content": "hi"}]))
        except lanes.JobFailed:
            pass
trio.run(main)
loaded = sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")
assert not loaded, loaded
"""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", code], env=clean, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_endpoint_comes_from_config_else_the_standard_variables():
    """`[telemetry]` wins; unset, `OTEL_EXPORTER_OTLP_ENDPOINT` and `OTEL_SERVICE_NAME` apply;
    neither: no traces; `OTEL_SDK_DISABLED=true` switches them off."""
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://10.0.0.5:4318/", "OTEL_SERVICE_NAME": "edge"}
    assert target(TelemetryConfig(), {}) is None
    assert target(TelemetryConfig(), env) == Target(
        url="http://10.0.0.5:4318/v1/traces",
        service_name="edge",
        queue_size=2048,
        export_timeout_s=10.0,
    )
    configured = TelemetryConfig(otlp_endpoint="http://127.0.0.1:4318", service_name="mine")
    chosen = target(configured, env)
    assert chosen is not None
    assert (chosen.url, chosen.service_name) == ("http://127.0.0.1:4318/v1/traces", "mine")
    assert target(configured, {"OTEL_SDK_DISABLED": "true"}) is None


def test_a_bad_telemetry_value_is_a_config_error_naming_the_key():
    """A bad key names itself; a bad variable names the variable and never shows its value."""
    with pytest.raises(lanes.ConfigError) as bad_key:
        lanes.load_config({"telemetry": {"otlp_endpoint": "collector:4318"}}, env={})
    assert bad_key.value.key == "telemetry.otlp_endpoint"
    with pytest.raises(lanes.ConfigError) as bad_size:
        lanes.load_config({"telemetry": {"queue_size": 0}}, env={})
    assert bad_size.value.key == "telemetry.queue_size"
    with pytest.raises(lanes.ConfigError) as bad_env:
        target(TelemetryConfig(), {"OTEL_EXPORTER_OTLP_ENDPOINT": "tcp://s3cr3t@x"})
    assert bad_env.value.key == "OTEL_EXPORTER_OTLP_ENDPOINT" and "s3cr3t" not in str(bad_env.value)


@pytest.mark.parametrize(
    "header",
    [
        f"00-{TRACE_ID}-{CALLER_SPAN}",  # a field short
        f"00-{TRACE_ID.upper()}-{CALLER_SPAN}-01",  # upper-case hex
        f"00-{'0' * 32}-{CALLER_SPAN}-01",  # an all-zero trace id
        f"00-{TRACE_ID}-{'0' * 16}-01",  # an all-zero parent id
        f"ff-{TRACE_ID}-{CALLER_SPAN}-01",  # the forbidden version
        f"00-{TRACE_ID}-{CALLER_SPAN}-01-more",  # version 00 with more after it
        "00-" + "a" * 600,  # beyond any bound
        "",
        None,
    ],
)
def test_a_malformed_traceparent_reads_as_none(header):
    """Anything but a W3C `traceparent` is no parent: the job starts its own trace."""
    assert parse(header) is None and normalised(header) is None


def test_a_traceparent_is_read_and_kept_exactly():
    """A valid header (and a later version's, whose extra fields are not read) is kept as
    version 00, with its ids and sampled flag."""
    parent = parse(f" {TRACEPARENT} ")
    assert parent is not None and parent.sampled
    assert (parent.trace_id, parent.span_id) == (int(TRACE_ID, 16), int(CALLER_SPAN, 16))
    assert normalised(f"01-{TRACE_ID}-{CALLER_SPAN}-00-future") == f"00-{TRACE_ID}-{CALLER_SPAN}-00"
    assert Job(messages=[{"role": "user", "content": "x"}], traceparent="junk").traceparent is None


def test_an_approval_wait_is_a_span_of_its_own_at_the_times_recorded():
    """The wait for a paid-fallback approval is a child of the job's span, placed on the wall
    clock from the record's trio times; a failed job's span says `error.type`."""
    job = Job(messages=[{"role": "user", "content": PROMPT}])
    record = JobRecord(job, deadline_at=TrioTime(130.0), started_at=TrioTime(100.0))
    record.waits.append((101.0, 104.0, "ap_1"))
    trace = job_trace(
        record,
        "approval_required",
        ended_wall=1_000_000.0,
        ended_at=105.0,
        served=None,
        route=None,
        usage=None,
        provider_of=lambda lane: lane,
    )
    span, wait = trace.spans
    assert (span.start_ns, span.end_ns) == (999_995 * 10**9, 1_000_000 * 10**9)
    assert (wait.start_ns, wait.end_ns, wait.parent) == (999_996 * 10**9, 999_999 * 10**9, 0)
    assert wait.attributes == {"lanes.approval.id": "ap_1"}
    assert span.error == "approval_required" and trace.parent is None
    assert PROMPT not in repr(trace)

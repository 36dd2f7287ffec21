"""The sidecar's edge: every bad request is a clean OpenAI-shaped 4xx with no traceback, and slow,
stalled or too many connections are shed fast."""

from __future__ import annotations

import json
import logging
import signal

import httpx2
import pytest
import trio

from helpers import http_client
from lanes._core.dispatcher import Dispatcher
from lanes._http import endpoints
from lanes._http.errors import BadRequest
from lanes._http.validation import parse_decision, parse_job
from lanes.harness.configs import local_lane
from lanes.harness.processes import open_sidecar_process
from lanes.testing import open_fake
from sidecar import open_sidecar

OK = {"messages": [{"role": "user", "content": "hi"}]}


def refused(body: bytes | str, headers: dict[str, str] | None = None) -> BadRequest:
    raw = body.encode() if isinstance(body, str) else body
    with pytest.raises(BadRequest) as info:
        parse_job(raw, headers or {}, "anonymous")
    return info.value


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ('{"messages": [{"role": ["user"], "content": "x"}]}', "messages[0].role"),
        ('{"messages": [{"role": {"a": 1}, "content": "x"}]}', "messages[0].role"),
        ('{"messages": [{"role": "user", "content": 5}]}', "messages[0].content"),
        ('{"messages": [{"role": "user", "content": [5]}]}', "messages[0].content[0]"),
        ('{"messages": [{"role": "user", "content": [{"type": 1}]}]}', "messages[0].content[0]"),
        (
            '{"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]}',
            "messages[0].content[0].text",
        ),
        ('{"messages": [{"role": "user", "name": 3, "content": "x"}]}', "messages[0].name"),
        ('{"messages": [{"role": "assistant", "tool_calls": {}}]}', "messages[0].tool_calls"),
        ('{"messages": [{"role": "user", "content": NaN}]}', None),
        ('{"messages": [{"role": "user", "content": "x"}], "temperature": Infinity}', None),
        ('{"messages": [{"role": "user", "content": "x"}], "seed": 1e400}', "seed"),
        ('{"messages": [{"role": "user", "content": "\\ud800"}]}', "messages[0].content"),
        ('{"messages": [{"role": "user", "content": "x"}], "model": 7}', "model"),
        ('{"messages": [{"role": "user", "content": "x"}], "stream": "yes"}', "stream"),
        ('{"messages": [{"role": "user", "content": "x"}], "max_tokens": 10e30}', "max_tokens"),
        ('{"messages": [{"role": "user", "content": "x"}], "max_tokens": 1e400}', "max_tokens"),
        ('{"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}', "max_tokens"),
        ('{"messages": [{"role": "user", "content": "x"}], "max_tokens": true}', "max_tokens"),
        ('{"messages": [{"role": "user", "content": "x"}], "n": 0}', "n"),
        ('{"messages": [{"role": "user", "content": "x"}], "n": "2"}', "n"),
        ('{"messages": [{"role": "user", "content": "x"}], "n": 2.0}', "n"),
        ('{"messages": [{"role": "user", "content": "x"}], "n": true}', "n"),
        ('{"messages": [{"role": "user", "content": "x"}], "n": 129}', "n"),
        ('{"messages": [{"role": "user", "content": "x"}], "tools": {"a": 1}}', "tools"),
        ('{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": 1}]}', "tools[0]"),
        ('{"messages": [{"role": "user", "content": "x"}], "response_format": "json"}', None),
        ('{"messages": [{"role": "user", "content": "x"}], "tool_choice": 3}', "tool_choice"),
        ('{"messages": []}', "messages"),
        ("[1, 2]", None),
        ('"just a string"', None),
    ],
)
def test_a_field_of_the_wrong_type_is_a_400_naming_it(body, param):
    """Every field the sidecar reads is type-checked; NaN, infinities, huge numbers and lone
    surrogates are refused; the error names the field."""
    error = refused(body)
    assert error.status == 400
    if param is not None:
        assert error.param == param, (error.param, str(error))


@pytest.mark.parametrize("depth", [65, 999, 1000, 5000, 100_000])
def test_deep_nesting_is_refused_without_recursion(depth):
    """Nesting past 64 levels — up to 100,000 — is a 400, never a RecursionError."""
    body = '{"messages": [{"role": "user", "content": "x"}], "extra": ' + "[" * depth + "]" * depth
    error = refused(body + "}")
    assert error.code == "invalid_json" and "nested deeper" in str(error)


@pytest.mark.parametrize("value", ["²", "¹⁰⁰", "١٢٣", "12.5", "-1", "0", "3600001", "1e3", " ", ""])
def test_the_deadline_header_takes_ascii_digits_only(value):
    """X-Lanes-Deadline-Ms: superscripts, other scripts' digits, fractions, signs and out-of-range
    values are a 400 naming the header (`isdigit()` alone would accept "²" and crash `int`)."""
    error = refused(json.dumps(OK), {"x-lanes-deadline-ms": value})
    assert error.param == "X-Lanes-Deadline-Ms"


def test_text_headers_are_bounded_and_printable():
    """X-Lanes-Cohort and X-Lanes-Class: printable ASCII, at most 256 characters."""
    assert refused(json.dumps(OK), {"x-lanes-cohort": "a" * 300}).param == "X-Lanes-Cohort"
    assert refused(json.dumps(OK), {"x-lanes-class": "a\x01b"}).param == "X-Lanes-Class"
    job, _ = parse_job(json.dumps(OK).encode(), {"x-lanes-cohort": " canary-7 "}, "anonymous")
    assert job.cohort == "canary-7"


@pytest.mark.parametrize("value", [float("inf"), 1e300, 10**400, -5, 0, "99999999h", "1e9h", True])
def test_an_approval_duration_is_bounded(value):
    """An approval of infinite, huge, negative or zero length is a 400, never a grant."""
    with pytest.raises(BadRequest):
        parse_decision(value)
    assert parse_decision("1h") == 3600.0 and parse_decision(60) == 60.0


async def _raw(port: int, data: bytes, *, read_s: float = 5.0) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(data)
        received = b""
        with trio.move_on_after(read_s):
            while chunk := await stream.receive_some(65536):
                received += chunk
    return received


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


def _shaped(response: bytes, status: int) -> dict[str, object]:
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d" % status), head
    error = json.loads(body)["error"]
    assert set(error) >= {"message", "type", "code", "param"}
    return error


def openai_shaped(response: httpx2.Response) -> bool:
    try:
        body = response.json()
    except ValueError:
        return False
    return isinstance(body, dict) and isinstance(body.get("error"), dict)


async def test_protocol_errors_are_openai_shaped():
    """A malformed request line and headers over 16 KiB: hypercorn's own 400 and 431 carry an
    OpenAI-shaped body."""
    async with open_sidecar(("local", "local", ["local-model"])) as (url, _):
        port = _port(url)
        garbage = await _raw(port, b"GARBAGE\r\n\r\n")
        huge = await _raw(
            port, b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\nx-big: " + b"a" * 20000
        )
    assert _shaped(garbage, 400)["code"] == "bad_request"
    assert _shaped(huge, 431)["code"] == "headers_too_large"


async def test_slow_and_stalled_clients_are_shed():
    """Slow-loris (headers trickling in) is cut at idle_timeout_s; a stalled body gets a 408 at
    body_timeout_s; meanwhile /health answers."""
    server = {"idle_timeout_s": 0.5, "body_timeout_s": 0.5}
    async with open_sidecar(("local", "local", ["local-model"]), server=server) as (url, _):
        port = _port(url)
        start = trio.current_time()
        loris = await trio.open_tcp_stream("127.0.0.1", port)
        async with loris:
            cut = False
            with trio.move_on_after(5):
                try:
                    while True:
                        await loris.send_all(b"x")
                        await trio.sleep(0.1)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    cut = True
        loris_s = trio.current_time() - start
        stalled = await _raw(
            port,
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
            b"content-type: application/json\r\ncontent-length: 1000\r\n\r\n{",
        )
        async with httpx2.AsyncClient(trust_env=False) as http:
            health = await http.get(url.replace("/v1", "/health"), timeout=2)
    assert cut and loris_s < 3
    assert _shaped(stalled, 408)["code"] == "body_timeout"
    assert health.status_code == 200


async def test_connections_over_the_cap_are_refused_fast():
    """With max_connections = 4, a fifth connection is answered 503 at once and closed; when the
    four go away, /health answers again."""
    async with open_sidecar(("local", "local", ["local-model"]), server={"max_connections": 4}) as (
        url,
        _,
    ):
        port = _port(url)
        held = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(4)]
        await trio.sleep(0.2)
        start = trio.current_time()
        busy = await _raw(port, b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n", read_s=2)
        busy_s = trio.current_time() - start
        for stream in held:
            await stream.aclose()
        await trio.sleep(0.2)
        async with httpx2.AsyncClient(trust_env=False) as http:
            health = await http.get(url.replace("/v1", "/health"), timeout=2)
    assert _shaped(busy, 503)["code"] == "too_many_connections" and busy_s < 1.5
    assert health.status_code == 200


async def test_client_mistakes_leave_no_traceback(caplog):
    """A batch of bad requests through the real sidecar: each a 4xx, OpenAI-shaped, and nothing
    at ERROR (no traceback) in any log."""
    caplog.set_level(logging.DEBUG)
    bodies = [
        b'{"messages": [{"role": ["user"]}]}',
        b'{"messages": [{"role": "user", "content": NaN}]}',
        b"[" * 3000 + b"]" * 3000,
        b'{"messages": [{"role": "user", "content": "\\udc00"}]}',
        b"\xff\xfe\x00",
        b"",
    ]
    async with (
        open_sidecar(("local", "local", ["local-model"])) as (url, _),
        httpx2.AsyncClient(trust_env=False, timeout=5) as http,
    ):
        answers = [
            await http.post(
                f"{url}/chat/completions",
                content=body,
                headers={"content-type": "application/json"},
            )
            for body in bodies
        ]
        answers.append(await http.post(f"{url}/approvals/nope", json={"decision": 1e300}))
        answers.append(await http.post(url.replace("/v1", "/v1/approvals/x"), content=b"[" * 5000))
        body = json.dumps(OK).encode()
        superscript = await _raw(
            _port(url),
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n"
            b"x-lanes-deadline-ms: \xb2\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body),
        )
    for answer in answers:
        assert 400 <= answer.status_code < 500, answer.text
        assert set(answer.json()["error"]) >= {"message", "type", "code", "param"}
    assert _shaped(superscript, 400)["param"] == "X-Lanes-Deadline-Ms"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "Traceback" not in caplog.text


@pytest.mark.parametrize("since", ["9" * 25 + "d", "9" * 400 + "d"])
async def test_a_huge_report_window_is_a_400(since):
    """`GET /v1/report?since=…` with a huge number of days: a 400 naming `since`, not a 500
    (OverflowError in the float product, or in SQLite's integer)."""
    async with (
        open_sidecar(("local", "local", ["local-model"])) as (url, _fakes),
        http_client() as http,
    ):
        response = await http.get(f"{url}/report", params={"since": since})
    assert response.status_code == 400 and openai_shaped(response)


@pytest.mark.parametrize("metadata", ["abc", [1], [[1, 2, 3]]])
async def test_responses_metadata_that_is_no_object_is_a_400_before_anything_is_sent(metadata):
    """`metadata` is echoed in the response; one that is not an object is read by `dict()` only
    after the job was served (and, on a paid lane, billed): the client gets a 500 and retries."""
    async with (
        open_sidecar(("local", "local", ["local-model"])) as (url, fakes),
        http_client() as http,
    ):
        response = await http.post(f"{url}/responses", json={"input": "hi", "metadata": metadata})
    assert response.status_code == 400 and openai_shaped(response)
    assert fakes["local"].requests() == []


@pytest.mark.parametrize("path", ["/chat/completions", "/embeddings", "/lanes/local/off"])
async def test_a_malformed_origin_is_refused_cleanly(path):
    """`Origin: http://[::1` (an unclosed IPv6 literal) makes `urlsplit` raise: a 500 and a
    traceback on every job door and every action, instead of a 403."""
    async with (
        open_sidecar(("local", "local", ["local-model"])) as (url, _fakes),
        http_client() as http,
    ):
        response = await http.post(
            f"{url}{path}",
            json={**OK, "model": "local-model", "input": "x"},
            headers={"origin": "http://[::1"},
        )
    assert response.status_code == 403 and openai_shaped(response)


@pytest.mark.parametrize("role", [{"x": 1}, ["user"]])
async def test_a_responses_input_role_that_is_no_string_is_a_400(role):
    """`input[0].role` an object or an array: `_ROLES.get(role)` raises TypeError (unhashable),
    a 500, where every other wrong type is a 400 naming the field."""
    async with (
        open_sidecar(("local", "local", ["local-model"])) as (url, _fakes),
        http_client() as http,
    ):
        response = await http.post(
            f"{url}/responses",
            json={"input": [{"type": "message", "role": role, "content": "hi"}]},
        )
    assert response.status_code == 400 and openai_shaped(response)


async def test_a_responses_cap_out_of_range_names_the_clients_field():
    """`max_output_tokens` above 10^8 on `/v1/responses`: the 400 names `max_tokens` (the
    translation's field), which the client never sent."""
    async with (
        open_sidecar(("local", "local", ["local-model"])) as (url, _fakes),
        http_client() as http,
    ):
        response = await http.post(
            f"{url}/responses", json={"input": "hi", "max_output_tokens": 10**9}
        )
    assert response.status_code == 400 and response.json()["error"]["param"] == "max_output_tokens"


@pytest.mark.slow
async def test_sighup_is_logged_and_ignored(tmp_path):
    """SIGHUP does not stop the sidecar: one line says the config is read at startup only."""
    async with open_fake("local", models=("local-model",)) as local:
        config = {"state": ":memory:", "lanes": [local_lane("local", local.base_url)]}
        async with (
            open_sidecar_process(config, tmp_path) as sidecar,
            httpx2.AsyncClient(trust_env=False, timeout=5) as http,
        ):
            sidecar.process.send_signal(signal.SIGHUP)
            await trio.sleep(0.3)
            health = await http.get(f"{sidecar.base}/health")
            served = await http.post(f"{sidecar.base}/v1/chat/completions", json=OK)
            alive = sidecar.process.returncode is None
        log = sidecar.log()
    assert alive and health.status_code == 200 and served.status_code == 200
    assert log.count("SIGHUP ignored") == 1


async def test_the_chat_front_door_leaves_everything_else_to_starlette(monkeypatch):
    """POST /v1/chat/completions goes past Starlette's stack, and nothing else does: GET there is an
    OpenAI-shaped 405, a trailing slash is redirected, and a chat handler that fails is answered
    an OpenAI-shaped 500 that tells nothing of the failure, as every other route's is."""
    async with (
        open_sidecar(("local", "local", ["local-model"])) as (url, _),
        httpx2.AsyncClient(trust_env=False, timeout=5) as http,
    ):
        served = await http.post(f"{url}/chat/completions", json=OK)
        wrong_method = await http.get(f"{url}/chat/completions")
        slash = await http.post(f"{url}/chat/completions/", json=OK)

        async def broken(self: Dispatcher, job: object) -> None:
            raise RuntimeError("a bug in the chat path")

        monkeypatch.setattr(Dispatcher, "complete", broken)

        def broken_models(*args: object, **kw: object) -> None:
            raise RuntimeError("a bug in the models path")

        monkeypatch.setattr(endpoints, "models_list", broken_models)
        failed = await http.post(f"{url}/chat/completions", json=OK)
        failed_elsewhere = await http.get(f"{url}/models")
    assert served.status_code == 200 and served.headers["x-lanes-lane"] == "local"
    assert wrong_method.status_code == 405
    assert wrong_method.json()["error"]["code"] == "method_not_allowed"
    assert slash.status_code == 307
    assert slash.headers["location"].endswith("/v1/chat/completions")
    assert failed.status_code == 500 and failed.json()["error"]["code"] == "internal_error"
    assert failed.json()["error"]["type"] == "api_error" and "bug" not in failed.text
    assert failed_elsewhere.status_code == 500 and failed_elsewhere.json() == failed.json()


def test_a_deadline_header_counts_from_the_requests_arrival():
    """`X-Lanes-Deadline-Ms` is anchored at the moment the request's headers were in, so the time
    it waits for its body and its admission is spent from the client's deadline; outside a
    request (the library), the dispatcher anchors it when the job arrives."""
    from types import SimpleNamespace

    from lanes._http import departures
    from lanes._http.validation import job_headers

    token = departures._REQUEST.set(SimpleNamespace(arrived=100.0))  # type: ignore[arg-type]
    try:
        inside = job_headers({"x-lanes-deadline-ms": "1500"})
        default = job_headers({})
    finally:
        departures._REQUEST.reset(token)
    outside = job_headers({"x-lanes-deadline-ms": "1500"})
    assert (inside["deadline_at"], inside["deadline_s"]) == (101.5, 1.5)
    assert default["deadline_at"] is None and default["deadline_s"] is None
    assert outside["deadline_at"] is None and outside["deadline_s"] == 1.5

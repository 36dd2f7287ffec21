"""Fuzz: hostile clients and hostile upstreams driven through a real `lanes serve` process.

One sidecar process for the module, in front of two fake providers served from a thread of this
process: `sick` (scripted per example, one fresh model per example so no breaker or backoff carries
over) and `good` (always healthy). Hypothesis draws the requests and the answers (deterministic,
bounded); after every example the process must be alive with no breaker's probe left out, and at
the end its log must hold no traceback and its paid ledger at least what the upstreams billed.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio
from fuzz import (
    EVENT_CAP,
    MAX_TOKENS,
    POLICY,
    PRICES,
    SMALL_CAP,
    Answer,
    billed_usd,
    check_error_shape,
    http_request,
    json_answers,
    raw_bodies,
    request_headers,
    stream_answers,
)
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from helpers import PAID_KEY
from lanes._core.freetier.prices import usage_cost
from lanes.harness.configs import paid_lane
from lanes.harness.processes import dump_toml, free_port
from lanes.testing import FakeProvider, answer, open_fake

pytestmark = pytest.mark.slow  # one `lanes serve` process for the module

MODELS = 60  # one fresh sick model per upstream example
GOOD_USAGE = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
MESSAGES = [{"role": "user", "content": "Say the pangram, in full, please."}]


def fuzz(examples: int) -> settings:
    """Deterministic and bounded; no shrinking — against a real process a failing example can
    cost seconds, and shrinking runs it hundreds of times (the unshrunk example is reported)."""
    return settings(
        phases=[Phase.explicit, Phase.generate],
        max_examples=examples,
        derandomize=True,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


class World:
    """The fakes (in a thread running trio) and one `lanes serve` process in front of them."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self._ready, self._stop = threading.Event(), threading.Event()
        self.fakes: dict[str, FakeProvider] = {}
        self._thread = threading.Thread(target=trio.run, args=(self._host,), daemon=True)
        self.process: subprocess.Popen[bytes] | None = None
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "sidecar.log"

    async def _host(self) -> None:
        async with open_fake("sick") as sick, open_fake("good") as good:
            good.script("good-model", answer(usage=GOOD_USAGE))
            self.fakes = {"sick": sick, "good": good}
            self.token = trio.lowlevel.current_trio_token()
            self._ready.set()
            await trio.to_thread.run_sync(self._stop.wait)

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run `fn` in the fakes' trio thread (they are not thread-safe)."""
        return trio.from_thread.run_sync(fn, *args, trio_token=self.token)

    def start(self) -> World:
        self._thread.start()
        assert self._ready.wait(10)
        sick_models = [f"sick-{i}" for i in range(MODELS)]
        sick = paid_lane(
            "sick",
            self.fakes["sick"].base_url,
            sick_models,
            max_response_bytes=SMALL_CAP,
            max_event_bytes=EVENT_CAP,
            attempt_timeout_s=2,
            first_token_s=2,
            idle_s=1,
            breaker={"lane_models": 1000},
        )
        config = {
            "state": str(self.workdir / "state.db"),
            "default_deadline_s": 10.0,  # every answer within 10 s (the socket waits 15)
            "scoring": {"explore_rate": 0.0},
            "policy": POLICY,
            "server": {"port": self.port, "idle_timeout_s": 2, "body_timeout_s": 2},
            "lanes": [sick, paid_lane("good", self.fakes["good"].base_url, ["good-model"])],
        }
        path = self.workdir / "lanes.toml"
        path.write_text(dump_toml(config))
        env = {**os.environ, "PAID_API_KEY": PAID_KEY}
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "lanes", "serve", "--config", str(path)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if httpx2.get(f"{self.base}/health", timeout=0.5).status_code == 200:
                    return self
            except httpx2.TransportError:
                time.sleep(0.05)
        raise RuntimeError(f"the sidecar did not start: {self.log()[-2000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self._log.close()
        self._stop.set()
        self._thread.join(10)

    def alive(self) -> None:
        """The process is up, /health answers, and no breaker has a probe out."""
        assert self.process is not None and self.process.poll() is None, self.log()[-3000:]
        assert httpx2.get(f"{self.base}/health", timeout=5).status_code == 200
        state = httpx2.get(f"{self.base}/v1/lanes", timeout=5).json()
        for lane in state["lanes"]:
            assert not lane["breaker"]["probing"], lane["name"]
            assert not [m["model"] for m in lane["models"] if m["breaker"]["probing"]]

    def spent(self) -> float:
        return float(
            httpx2.get(f"{self.base}/v1/lanes", timeout=5).json()["paid"]["spent_today_usd"]
        )


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    started = World(tmp_path_factory.mktemp("fuzz-serve")).start()
    try:
        yield started
    finally:
        started.stop()


def send(port: int, data: bytes) -> tuple[int, bytes]:
    """One raw HTTP exchange; (status, body) of the answer (a chunked body is decoded)."""
    with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
        sock.sendall(data)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in head.lower():
        body = _dechunk(body)
    return status, body


def _dechunk(body: bytes) -> bytes:
    out = b""
    while body:
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out, body = out + body[:size], body[size + 2 :]
    return out


def test_fuzzed_client_requests_through_lanes_serve(world):
    """Hostile request bodies and headers (wrong types, NaN, deep nesting, surrogates, bytes,
    superscript digits, control characters): every answer is a 2xx or a 4xx with an OpenAI-shaped
    body — a 504 only when the client asked for less than a second — and the process lives on."""

    @fuzz(120)
    @given(
        body=raw_bodies(),
        headers=request_headers,
        path=st.sampled_from(["/v1/chat/completions"] * 6 + ["/v1/approvals/x"]),
    )
    def example(body: bytes, headers: dict[bytes, bytes], path: str) -> None:
        status, answer_body = send(world.port, http_request(path, headers, body))
        deadline = headers.get(b"x-lanes-deadline-ms", b"").strip()
        short = deadline.isdigit() and deadline.isascii() and int(deadline) < 1000
        assert status < 500 or (status == 504 and short), (status, answer_body[:300])
        if status >= 400:
            check_error_shape(answer_body)

    example()
    world.alive()
    assert "Traceback" not in world.log()


def test_fuzzed_upstream_answers_through_lanes_serve(world):
    """Any answers from one upstream model, streamed or not, through the real process: a healthy
    upstream always serves (200); otherwise errors are OpenAI-shaped and never a 500 of ours; the
    process lives, no probe is left out, and the paid ledger is at least what was billed."""
    counter = iter(range(MODELS))
    sent: list[tuple[Answer, bool]] = []
    before = world.spent()

    @fuzz(MODELS)
    @given(
        answers=st.lists(st.one_of(json_answers(), stream_answers()), min_size=1, max_size=3),
        streamed=st.lists(st.booleans(), min_size=1, max_size=3),
    )
    def example(answers: list[Answer], streamed: list[bool]) -> None:
        model = f"sick-{next(counter)}"
        world.call(world.fakes["sick"].script, model, *[a.behaviour for a in answers])
        for i, stream in enumerate(streamed):
            healthy = all(a.serves(stream) for a in answers[: i + 1])
            body = {
                "model": f"sick/{model}",
                "messages": MESSAGES,
                "max_tokens": MAX_TOKENS,
                "stream": stream,
            }
            status, raw = send(
                world.port, http_request("/v1/chat/completions", {}, json.dumps(body).encode())
            )
            assert status != 500, raw[:300]
            if healthy:
                assert status == 200, (status, raw[:300])
            if status >= 400:
                check_error_shape(raw)
        requests = world.call(world.fakes["sick"].requests, model)
        sent.extend((answers[min(i, len(answers) - 1)], True) for i in range(len(requests)))
        world.alive()

    example()
    good = len(world.call(world.fakes["good"].requests, "good-model"))
    billed = billed_usd(sent) + good * (usage_cost(GOOD_USAGE, *PRICES) or 0.0)
    spent = world.spent() - before
    assert spent >= billed - 1e-9, (spent, billed)
    assert "Traceback" not in world.log()

"""One writer per connection: the task answering a request and the task reading the connection
never write to its socket at once, whoever ends the exchange and however — a client leaving
mid-body while its answer is being written, mid-stream, right after its headers (real loopback
sockets; nothing may reach the log as a traceback)."""

from __future__ import annotations

import contextlib
import json
import logging
import socket

import httpx2
import trio

from lanes._core.config.schema import ServerConfig
from lanes._http.connections import serve_http
from lanes._http.server import _hypercorn
from lanes.testing import garbage, hang, reset, stream_cut, stream_stall
from sidecar import CLIENT_KEY, open_sidecar

HEAD = b"POST /x HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: 1000\r\n\r\n"


async def trickling_app(scope, receive, send):
    """Answers at once, without reading the body, and keeps writing a byte per scheduler turn —
    as an answer refused before its body arrived, or a stream, does while its client goes."""
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    for _ in range(100_000):
        await send({"type": "http.response.body", "body": b"x", "more_body": True})
        await trio.lowlevel.checkpoint()
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def leave_mid_body(port: int) -> None:
    """Send the headers and part of the body, read the answer's head, half-close (the body is now
    cut short: hypercorn closes the connection) and read to the end (no reset)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(HEAD + b"abc")
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(65536)
        sock.shutdown(socket.SHUT_WR)
        while sock.recv(65536):
            pass


async def test_a_client_leaving_mid_body_while_its_answer_is_written_logs_nothing(caplog):
    """Hypercorn closing a connection whose body was cut short (its reader task: EOF, then
    `send_eof`) while the app's task writes the answer: never two writers at once — no
    `BusyResourceError`, no "Error in ASGI Framework"."""
    caplog.set_level(logging.DEBUG)
    hc = _hypercorn(ServerConfig(), "127.0.0.1:0")
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            lambda task_status: serve_http(
                trickling_app, hc, cap=64, shutdown_trigger=stop.wait, task_status=task_status
            )
        )
        port = int(binds[0].rsplit(":", 1)[1])
        for _ in range(30):
            await trio.to_thread.run_sync(leave_mid_body, port)
        stop.set()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors] + [caplog.text[-2000:]]
    assert "BusyResourceError" not in caplog.text


MODELS = ["ok-model", "reset-model", "garbage-model", "cut-model", "stall-model", "hang-model"]
KEYED = {"clients": {"alice": "CLIENT_KEY"}, "max_body_bytes": 4096, "body_timeout_s": 2.0}
CHAT = b"/v1/chat/completions"


def request(
    body: bytes,
    *,
    path: bytes = CHAT,
    key: bool = True,
    host: bytes = b"127.0.0.1",
    kind: bytes = b"application/json",
    length: int | None = None,
) -> bytes:
    head = [b"POST %s HTTP/1.1" % path, b"host: " + host, b"content-type: " + kind]
    head += [b"authorization: Bearer " + CLIENT_KEY.encode()] if key else []
    head += [b"content-length: %d" % (len(body) if length is None else length)]
    return b"\r\n".join([*head, b"connection: close", b"", b""]) + body


def chat(model: str, stream: bool = False) -> bytes:
    body = {
        "model": f"local/{model}",
        "stream": stream,
        "messages": [{"role": "user", "content": "hi"}],
    }
    return json.dumps(body).encode()


#: (what is sent, where the client leaves: None reads the answer to its end)
ACTIONS: list[tuple[bytes, str | None]] = [
    (request(chat("ok-model")), None),
    (request(b'{"messages": [{"role": '), None),  # bad JSON
    (request(chat("no-such-model")), None),
    (request(chat("ok-model"), key=False), None),  # 401
    (request(chat("ok-model"), kind=b"text/plain"), None),  # 415
    (request(chat("ok-model"), host=b"evil.example"), None),  # 421
    (request(b"x" * 1000, length=100_000), "half-close"),  # 413 while the body is cut short
    (request(b"x" * 1000, length=100_000), "close"),
    (request(b"x" * 1000, length=100_000), None),
    (request(chat("ok-model"), key=False)[:-10], "half-close"),  # 401 with the body cut short
    (request(chat("ok-model"))[:30], "close"),  # mid-headers
    (request(chat("ok-model"))[:-10], "close"),  # mid-body
    (request(chat("ok-model"))[:-10], "half-close"),
    (request(chat("hang-model")), "waiting"),  # after the request, before the answer
    (request(chat("stall-model", stream=True)), "streaming"),  # mid-stream
    (request(chat("cut-model", stream=True)), None),
    (request(chat("ok-model", stream=True)), "streaming"),
    (request(chat("reset-model")), None),
    (request(chat("garbage-model")), None),
    (request(chat("garbage-model", stream=True)), None),
    (b"GET /v1/lanes HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n", "close"),
    (b"GARBAGE\x00 / HTTP/9\r\n\r\n", None),
]


async def one(port: int, sent: bytes, leave: str | None) -> None:
    """Send `sent` on a new connection and leave as `leave` says (or read the answer to its end)."""
    with trio.move_on_after(10):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await stream.send_all(sent)
                if leave == "close":
                    return
                if leave == "half-close":
                    await stream.send_eof()
                elif leave == "waiting":
                    await trio.sleep(0.02)
                    return
                seen = b""
                while chunk := await stream.receive_some(65536):
                    seen += chunk
                    if leave == "streaming" and b"data:" in seen:
                        return


async def test_an_error_heavy_soak_with_clients_leaving_everywhere_logs_no_traceback(caplog):
    """Clients at once, each through every mistake, refusal and upstream fault, leaving at every
    point (mid-headers, mid-body, waiting, mid-stream; closing or half-closing): nothing at ERROR,
    no traceback, and the sidecar still answers."""
    caplog.set_level(logging.DEBUG)
    lane = ("local", "local", MODELS)
    async with open_sidecar(lane, server=KEYED) as (url, fakes):
        fake = fakes["local"]
        fake.script("reset-model", reset())
        fake.script("garbage-model", garbage())
        fake.script("cut-model", stream_cut(after=1))
        fake.script("stall-model", stream_stall(after=1))
        fake.script("hang-model", hang())
        port = int(url.rsplit(":", 1)[1].removesuffix("/v1"))

        async def client(offset: int) -> None:
            for i in range(3 * len(ACTIONS)):
                sent, leave = ACTIONS[(offset + i) % len(ACTIONS)]
                await one(port, sent, leave)

        async with trio.open_nursery() as nursery:
            for offset in range(8):
                nursery.start_soon(client, offset * 3)
        async with httpx2.AsyncClient(trust_env=False, timeout=10) as http:
            health = await http.get(url.replace("/v1", "/health"))
    assert health.status_code == 200
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors][:5]
    assert "Traceback" not in caplog.text and "BusyResourceError" not in caplog.text

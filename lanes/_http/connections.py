"""The sidecar's connections: accepted by us, served by hypercorn's HTTP/1.1 machinery (HTTP/1.1
only: `http11.py`), bounded.

Hypercorn's own `serve()` accepts every connection it can; a flood then reaches the descriptor
limit, `accept` fails in a loop, and nothing — `/health` included — is answered until the flood's
connections time out. Here:

- at most `cap` connections are open at once: `server.max_connections`, and never more than the
  descriptor limit leaves room for (half of what remains after a reserve: each connection may
  need an upstream connection too). A connection beyond the cap is answered at once with an
  OpenAI-shaped 503 and closed — refused fast, never queued;
- a connection that has not sent a request's headers within `idle_timeout_s` (slow-loris), or sits
  idle that long between requests, is closed (hypercorn's keep-alive timer runs until the headers
  are complete); a body must arrive within `body_timeout_s` (the app answers 408);
- a connection whose client went away is closed at once (hypercorn waits out its keep-alive timer
  first), so the descriptors of a flood come back as soon as it ends;
- a descriptor shortage at `accept` (EMFILE) is one log line per streak, not one per try.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import resource
from collections.abc import Awaitable, Callable
from typing import Any

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import parse_socket_addr, wrap_app

from lanes._http.departures import Requests
from lanes._http.errors import error_body
from lanes._http.http11 import HTTP11

log = logging.getLogger("lanes.http")
RESERVE_FDS = 64  # descriptors kept for the state file, logs, Redis and the listeners
_SHORTAGE = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


def _json_response(status: int, message: str, code: str, extra: bytes = b"") -> bytes:
    body = json.dumps(error_body(status, message, code)).encode()
    reason = {503: b"Service Unavailable"}.get(status, b"")
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"connection: close\r\n%s\r\n" % (status, reason, len(body), extra)
    ) + body


BUSY = _json_response(
    503,
    "too many connections open to this sidecar; retry shortly",
    "too_many_connections",
    b"retry-after: 1\r\n",
)


def raise_descriptor_limit() -> int:
    """Raise the soft limit on open descriptors to the hard one (as servers do); return it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def connection_cap(configured: int) -> int:
    """At most `configured`, and at most half the descriptors left after the reserve."""
    return max(1, min(configured, (raise_descriptor_limit() - RESERVE_FDS) // 2))


class _Connection(TCPServer):
    """Hypercorn's connection on a plain socket, speaking HTTP/1.1 only (`HTTP11`: hypercorn's
    would switch to HTTP/2), and one whose peer has gone is closed at once: hypercorn's waits out
    its keep-alive timer first, holding the descriptor (and, here, a place under the cap)."""

    async def run(self) -> None:
        """Hypercorn's `run` for a plain socket, with `HTTP11` where it would pick a protocol, and
        `Requests` for its task group."""
        socket = self.stream.socket
        try:
            client = parse_socket_addr(socket.family, socket.getpeername())
            server = parse_socket_addr(socket.family, socket.getsockname())
            async with Requests() as task_group:  # each request cancelled if its client leaves
                self._task_group = task_group
                # typed as hypercorn's protocol wrapper, which has the same two methods
                self.protocol = HTTP11(  # type: ignore[assignment]
                    self.app,
                    self.config,
                    self.context,
                    task_group,
                    ConnectionState(self.state),
                    False,
                    client,
                    server,
                    self.protocol_send,
                )
                await self.idle_task.restart(task_group, self._idle_timeout)
                await self._read_data()
        except OSError:
            pass
        finally:
            await self._close()

    async def _read_data(self) -> None:
        await super()._read_data()
        await self.idle_task.stop()

    async def _close(self) -> None:
        """Hypercorn's close, with one writer: its `send_eof` writes (a FIN) outside the send lock
        every other write takes, and yields inside trio's send-conflict check — so the request's
        task, writing its answer as the reading task closed a connection whose body was cut short,
        found the socket busy (`BusyResourceError`, an "Error in ASGI Framework" traceback). Here
        the EOF is sent under the lock, and only when no write is under way (closing the socket
        ends that write; it is caught as a closed connection). Closing takes no lock: a writer
        blocked on a client that stopped reading is woken by it, never waited for."""
        try:
            if not self.send_lock.locked():
                async with self.send_lock:
                    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                        await self.stream.send_eof()
        finally:
            await self.stream.aclose()


class ConnectionGate:
    """Counts open connections against the cap."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.open = 0
        self.refused = 0


async def serve_http(
    app: Any,
    hc: HypercornConfig,
    *,
    cap: int,
    shutdown_trigger: Callable[[], Awaitable[Any]],
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `app` on `hc.bind` until `shutdown_trigger` returns; then stop accepting and let
    requests in flight finish within `hc.graceful_timeout`."""
    wrapped = wrap_app(app, hc.wsgi_max_body_size, "asgi")
    context = WorkerContext(None)
    gate = ConnectionGate(cap)
    sockets = hc.create_sockets().insecure_sockets
    for sock in sockets:
        sock.listen(hc.backlog)
    listeners = [trio.socket.from_stdlib_socket(sock) for sock in sockets]
    binds = ["http://" + bind_of(*sock.getsockname()[:2]) for sock in sockets]
    async with trio.open_nursery() as connections:

        async def serve_one(sock: trio.socket.SocketType) -> None:
            try:
                stream = trio.SocketStream(sock)
                # hypercorn types its stream as TLS; it serves a plain one as its own serve() does
                await _Connection(wrapped, hc, context, ConnectionState({}), stream)  # type: ignore[arg-type]
            finally:
                gate.open -= 1

        async with trio.open_nursery() as accepting:
            for listener in listeners:
                accepting.start_soon(_accept, listener, gate, connections, serve_one)
            task_status.started(binds)
            await shutdown_trigger()
            accepting.cancel_scope.cancel()
        for listener in listeners:
            listener.close()
        await context.terminated.set()  # idle connections close; requests in flight finish
        connections.cancel_scope.deadline = trio.current_time() + hc.graceful_timeout


async def _accept(
    listener: trio.socket.SocketType,
    gate: ConnectionGate,
    nursery: trio.Nursery,
    serve_one: Callable[[trio.socket.SocketType], Awaitable[None]],
) -> None:
    short = False
    while True:
        try:
            sock, _ = await listener.accept()
        except OSError as exc:
            if exc.errno not in _SHORTAGE:
                raise
            if not short:
                log.warning("accept: %s; waiting for descriptors to free up", exc.strerror)
            short = True
            await trio.sleep(0.05)
            continue
        short = False
        if gate.open >= gate.cap:
            gate.refused += 1
            await _refuse(sock)
            continue
        gate.open += 1
        nursery.start_soon(serve_one, sock)


async def _refuse(sock: trio.socket.SocketType) -> None:
    """Over the cap: an OpenAI-shaped 503 if the socket takes it at once, then close."""
    with trio.move_on_after(0.05), contextlib.suppress(OSError):
        await sock.send(BUSY)
    sock.close()


def bind_of(host: str, port: int) -> str:
    """`host:port` as a bind or a URL names it: an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

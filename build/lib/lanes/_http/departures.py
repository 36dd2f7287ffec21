"""A client that goes away takes its request with it, on every door, streamed or not.

Hypercorn tells the app that its client left with an `http.disconnect` message, the next one
`receive()` returns once the request's body is in — but only to a caller of `receive()`, and a
handler awaiting `dispatcher.complete(job)` calls nobody: a non-streamed job ran on to `ok` after
its client had left, and a paid upstream billed it. So every request runs in a cancel scope of its
own (`Requests`, the connection's task group), and hypercorn handing it the disconnect cancels it —
no task watches `receive()`, no handler has to: the job is cancelled with it: the upstream request
is dropped at once, the breaker permits and probe are given back, a paid attempt already sent is
settled as the upstream may bill it (its reservation) and one not sent is not billed, and the job is
audited `abandoned` (`engine/attempt.py`, `dispatcher.py`). A client leaving mid-body ends the
handler the same way.

What counts as leaving is what hypercorn reports, which is what the socket shows: a close (FIN),
a reset (RST), and a half-close — `shutdown(SHUT_WR)` after the request — too. A FIN after a
complete request looks the same whether the client half-closed or closed: only writing to it tells
them apart (a closed peer answers with a reset), and HTTP/1.1 lets a server write nothing but the
answer. Honouring half-close would keep the job of every client that closed and left running to
its end, which is what this module prevents. Mainstream clients (curl, httpx, requests, the OpenAI
and Anthropic SDKs, browsers) never half-close an HTTP/1.1 request, and proxies end the request
too (nginx answers 499 unless `proxy_ignore_client_abort`; Pingora's `abort_on_close` is on by
default). A client that wants its answer keeps its sending side open until it has it.

An operator's decision is not cut (`departure_shield`, around the admin endpoints that act): it is
several store writes, and one sent in full is made whole — the request is cancelled after it.

Once the answer's last message is sent, a disconnect cancels nothing: hypercorn answers that message
with one (the exchange is over), which must not cancel the handler's last steps.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio.task_group import TaskGroup
from hypercorn.typing import (
    AppWrapper,
    ASGIReceiveCallable,
    ASGIReceiveEvent,
    ASGISendCallable,
    ASGISendEvent,
    Scope,
)

Put = Callable[[ASGIReceiveEvent], Awaitable[None]]
Send = Callable[[ASGISendEvent | None], Awaitable[None]]


class Requests(TaskGroup):
    """Hypercorn's task group for one connection's requests, each cancelled when its client goes
    away before its answer is out."""

    async def spawn_app(self, app: AppWrapper, config: Config, scope: Scope, send: Send) -> Put:
        request = _Request(app, send)
        request.put = await super().spawn_app(request, config, scope, request.send)
        return request.deliver


class _Request:
    """One request's app call in its cancel scope, between hypercorn and the app: what hypercorn
    hands the app (`deliver`: a disconnect cancels it), and what the app sends (`send`: after its
    last message, nothing is cancelled)."""

    def __init__(self, app: AppWrapper, send: Send) -> None:
        self._app, self._send = app, send
        self.put: Put | None = None
        self._scope = trio.CancelScope()
        self.arrived = trio.current_time()  # its headers are in: a job's deadline counts from here
        self._answered = False
        self.gone = False  # the client left before the answer was out
        self.shields = 0  # `departure_shield` blocks running

    async def __call__(
        self,
        scope: Scope,
        receive: ASGIReceiveCallable,
        send: ASGISendCallable,
        sync_spawn: Callable[..., Any],
        call_soon: Callable[..., Any],
    ) -> None:
        token = _REQUEST.set(self)
        try:
            with self._scope:
                await self._app(scope, receive, send, sync_spawn, call_soon)
        finally:
            _REQUEST.reset(token)

    async def deliver(self, message: ASGIReceiveEvent) -> None:
        """Hand the app `message` (what its `receive()` returns next)."""
        if message["type"] == "http.disconnect" and not self._answered:
            self.gone = True
            if not self.shields:
                self.cancel()
        assert self.put is not None, "hypercorn hands messages to a spawned app"
        await self.put(message)

    def cancel(self) -> None:
        """The client left: the handler, and its job, end here."""
        self._scope.cancel()

    async def send(self, message: ASGISendEvent | None) -> None:
        if (
            message is not None
            and message["type"] == "http.response.body"
            and not message.get("more_body", False)
        ):
            self._answered = True
        await self._send(message)


_REQUEST: ContextVar[_Request | None] = ContextVar("lanes_request", default=None)


def arrived_at() -> float | None:
    """When the current request's headers were in (trio's clock), or None outside a request: an
    `X-Lanes-Deadline-Ms` counts from there, so the time a request waits behind others for its
    body, its key check and its admission is the client's time too."""
    request = _REQUEST.get()
    return request.arrived if request is not None else None


@contextmanager
def departure_shield() -> Iterator[None]:
    """A block of the current request that its client leaving does not cut; if it left meanwhile,
    the request is cancelled when the block ends. Outside a request `Requests` serves: nothing."""
    request = _REQUEST.get()
    if request is None:
        yield
        return
    request.shields += 1
    try:
        yield
    finally:
        request.shields -= 1
        if request.gone and not request.shields:
            request.cancel()

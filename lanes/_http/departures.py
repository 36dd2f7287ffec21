"""A client that goes away takes its request with it, on every door, streamed or not.

Hypercorn tells the app that its client left with an `http.disconnect` message, the next one
`receive()` returns once the request's body is in — but only to a caller of `receive()`, and a
handler awaiting `dispatcher.complete(job)` calls nobody: a non-streamed job ran on to `ok` after
its client had left, and a paid upstream billed it. So every request runs under `watched`: once
its body is in, a watcher reads `receive()` while the handler runs, and the client leaving cancels
the handler — the job with it: the upstream request is dropped at once, the breaker permits and
probe are given back, a paid attempt already sent is settled as the upstream may bill it (its
reservation) and one not sent is not billed, and the job is audited `abandoned`
(`routing/attempt.py`, `dispatcher.py`). A client leaving mid-body ends the handler the same way.

What counts as leaving is what hypercorn reports, which is what the socket shows: a close (FIN),
a reset (RST), and a half-close — `shutdown(SHUT_WR)` after the request — too. A FIN after a
complete request looks the same whether the client half-closed or closed: only writing to it tells
them apart (a closed peer answers with a reset), and HTTP/1.1 lets a server write nothing but the
answer. Honouring half-close would keep the job of every client that closed and left running to
its end, which is what this module is for. Mainstream clients (curl, httpx, requests, the OpenAI
and Anthropic SDKs, browsers) never half-close an HTTP/1.1 request, and proxies end the request
too (nginx answers 499 unless `proxy_ignore_client_abort`; Pingora's `abort_on_close` is on by
default). A client that wants its answer keeps its sending side open until it has it.

The last message of the answer is sent with the watch stopped: hypercorn answers it with a
disconnect (the exchange is over), which must not cancel the handler's last steps.
"""

from __future__ import annotations

import trio
from starlette.types import ASGIApp, Message, Receive, Scope, Send


async def watched(app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
    """Run `app` for one HTTP request, cancelled the moment its client goes away."""
    async with trio.open_nursery() as nursery:
        watch = _Watch(receive, send, nursery)
        await app(scope, watch.receive, watch.send)
        nursery.cancel_scope.cancel()  # the handler is done: so is the watch


class _Watch:
    """The request's `receive` and `send`, as the handler sees them while the watch runs."""

    def __init__(self, receive: Receive, send: Send, nursery: trio.Nursery) -> None:
        self._receive, self._send, self._nursery = receive, send, nursery
        self._watching: trio.CancelScope | None = None  # the watcher reads `receive` from now on
        self._finishing = False  # the answer's last message is going out: nobody watches
        self._gone = trio.Event()

    async def receive(self) -> Message:
        if self._finishing:
            return await self._receive()
        if self._watching is not None:  # the body is in: what can come now is the disconnect
            await self._gone.wait()
            return {"type": "http.disconnect"}
        message = await self._receive()
        if message["type"] == "http.disconnect":  # gone mid-body
            self._left()
            await trio.lowlevel.checkpoint()  # the handler is cancelled here
        elif not message.get("more_body", False):
            self._watching = trio.CancelScope()
            self._nursery.start_soon(self._watch, self._watching)
        return message

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self._finishing = True
            if self._watching is not None:
                self._watching.cancel()
        await self._send(message)

    async def _watch(self, scope: trio.CancelScope) -> None:
        with scope:
            message: Message = {}
            while message.get("type") != "http.disconnect":
                message = await self._receive()
            self._left()

    def _left(self) -> None:
        self._gone.set()
        self._nursery.cancel_scope.cancel()

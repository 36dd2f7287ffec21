"""Fake OpenAI-compatible providers on 127.0.0.1 that fail on purpose, scripted per model name.

A real HTTP/1.1 server (trio sockets + h11), so tests and drills exercise real sockets: refused
connections, resets, hung sockets, cut chunked bodies. Every healthy text answer is `ANSWER`, so a
truncated answer is detectable; tools, `response_format`, `n`, `max_tokens` and `/embeddings` are
answered as `answers.py` says. Every request is logged with its time on trio's clock.

```python
async with open_fake("groq") as fake:  # answer, rate_limited, ... come from lanes.testing
    fake.script("llama", rate_limited(retry_after=5), answer())   # the last one repeats
    ... fake.base_url ... fake.log ...
    await fake.refuse()    # the port now refuses connections
    await fake.listen()    # and accepts again, on the same port
    await fake.wait_for(lambda f: f.departed)   # a client left before its answer was over
```

While it answers, the fake watches its client as a real server does: a client that closes or resets
its connection before the answer is over is noted in `departed` (with the time) and the answer is
dropped — so a test sees at once whether the sidecar let go of an upstream request.
"""

from __future__ import annotations

import itertools
import json
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import attrs
import h11
import trio

from lanes.testing import answers
from lanes.testing.behaviours import Behaviour, answer, quota_exceeded, quota_headers


@attrs.frozen(kw_only=True)
class Logged:
    """One request the fake received: when (trio clock), which model, streamed, what it did."""

    at: float
    model: str
    stream: bool
    behaviour: str
    path: str
    authorization: bool
    body: Mapping[str, Any] = attrs.field(factory=dict)  # kept in memory only, for assertions


@attrs.frozen(kw_only=True)
class Departed:
    """A request whose client went away before its answer was over: when (trio clock), its model."""

    at: float
    model: str
    request: int = 0  # which request: its index in the fake's `log`


class FakeProvider:
    """One fake provider. Use `open_fake()`; see the module docstring."""

    def __init__(
        self, name: str, nursery: trio.Nursery, port: int = 0, *, keep_bodies: bool = True
    ) -> None:
        self.name = name
        self.port = port
        self.log: list[Logged] = []
        self._keep_bodies = keep_bodies  # False: the log holds no request bodies (a long benchmark)
        self.departed: list[Departed] = []
        self.in_flight = 0  # requests received whose answer is not over yet
        self.models: list[str] = []
        self.balance: float | None = None  # served at GET …/key as data.limit_remaining
        self._nursery = nursery
        self._scripts: dict[str, list[Behaviour]] = {}
        self._default = answer()
        self._listen_scope: trio.CancelScope | None = None
        self._connections: set[trio.CancelScope] = set()
        self._windows: dict[str, tuple[int, int]] = {}  # model → (window index, requests in it)
        self.wall_offset = 0.0  # wall-clock epoch = trio clock + this (for epoch-style resets)
        # what GET …/models lists (default: the scripted models)
        self.catalog: list[dict[str, Any]] | None = None
        self.catalog_requests = 0
        self._catalog_script: list[Behaviour] = []  # what GET …/models answers instead of the list
        self.prefill = True  # continue a trailing assistant message (False: refuse it with a 400)
        self._news = trio.Event()  # set, and replaced, whenever a request arrives, ends or is left

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def script(self, model: str, *behaviours: Behaviour) -> None:
        """Answer `model`'s requests with `behaviours` in turn; the last one repeats."""
        self._scripts[model] = list(behaviours) or [self._default]
        if model not in self.models:
            self.models.append(model)

    def script_catalog(self, *behaviours: Behaviour) -> None:
        """Answer GET …/models with `behaviours` (`raw`, `replay` or `status`) in turn, the last
        one repeating, instead of the model list; none: the list again."""
        self._catalog_script = list(behaviours)

    def open_connections(self) -> int:
        """Connections a client holds open to this fake right now."""
        return len(self._connections)

    def requests(self, model: str | None = None) -> list[Logged]:
        return [r for r in self.log if model is None or r.model == model]

    async def wait_for(self, condition: Callable[[FakeProvider], object]) -> None:
        """Return once `condition(self)` is true: checked now, and whenever a request arrives, its
        answer is over or its client leaves. The caller owns the deadline."""
        while not condition(self):
            await self._news.wait()

    def _tell(self) -> None:
        self._news.set()
        self._news = trio.Event()

    def _next(self, model: str) -> Behaviour:
        script = self._scripts.get(model)
        if not script:
            return self._default
        return script.pop(0) if len(script) > 1 else script[0]

    async def listen(self) -> None:
        """Accept connections on `port` (a fresh one the first time)."""
        listeners = await trio.open_tcp_listeners(self.port, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        scope = trio.CancelScope()
        self._listen_scope = scope

        async def serve() -> None:
            with scope:
                await trio.serve_listeners(self._handle, listeners, handler_nursery=self._nursery)

        self._nursery.start_soon(serve)
        await trio.lowlevel.checkpoint()

    async def refuse(self) -> None:
        """Go down: drop open connections and close the listening socket; new connections are
        refused until `listen()`."""
        if self._listen_scope is not None:
            self._listen_scope.cancel()
            self._listen_scope = None
        for scope in self._connections:
            scope.cancel()
        self._connections.clear()
        await trio.lowlevel.checkpoint()

    async def _handle(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        scope = trio.CancelScope()
        self._connections.add(scope)
        try:
            with scope:
                await self._serve_connection(conn, stream)
        finally:
            self._connections.discard(scope)
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def _serve_connection(self, conn: h11.Connection, stream: trio.SocketStream) -> None:
        try:
            while True:
                request = await _receive_request(conn, stream)
                if request is None:
                    return
                head, raw = request
                if not await self._respond(conn, stream, head, raw):
                    return
                if conn.our_state is h11.MUST_CLOSE:
                    return
                conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            return  # the client left, or a scripted answer broke HTTP on purpose

    async def _respond(
        self, conn: h11.Connection, stream: trio.SocketStream, head: h11.Request, raw: bytes
    ) -> bool:
        path = head.target.decode()
        headers = {k.decode().lower(): v.decode() for k, v in head.headers}
        if head.method == b"GET" and path.endswith("/_log"):
            await _send_json(conn, stream, 200, [[r.model, r.at] for r in self.log], {})
            return True
        if head.method == b"GET" and path.endswith("/key"):
            self.log.append(
                Logged(
                    at=trio.current_time(),
                    model="",
                    stream=False,
                    behaviour="key",
                    path=path,
                    authorization="authorization" in headers,
                )
            )
            key = {"limit_remaining": self.balance, "is_free_tier": True}
            await _send_json(conn, stream, 200, {"data": key}, {})
            return True
        if head.method == b"GET" and path.endswith("/models"):
            self.catalog_requests += 1
            if script := self._catalog_script:
                said = script.pop(0) if len(script) > 1 else script[0]
                if said.kind == "raw":
                    return await _send_raw(conn, stream, said)
                await _send_json(conn, stream, said.status, said.body, said.headers)
                return True
            listed = self.catalog
            if listed is None:
                listed = [{"id": m, "object": "model"} for m in self.models]
            await _send_json(conn, stream, 200, {"object": "list", "data": listed}, {})
            return True
        try:
            request = json.loads(raw)
            model, streamed = str(request.get("model", "")), bool(request.get("stream"))
        except (ValueError, AttributeError):
            await _send_json(
                conn, stream, 400, {"error": {"message": "bad JSON", "code": "invalid_json"}}, {}
            )
            return True
        behaviour = self._next(model)
        self.log.append(
            Logged(
                at=trio.current_time(),
                model=model,
                stream=streamed,
                behaviour=behaviour.kind,
                path=path,
                authorization="authorization" in headers,
                body=request if self._keep_bodies else {},
            )
        )
        return await self._watched(
            conn, stream, model, lambda: self._perform(conn, stream, behaviour, request, path)
        )

    async def _watched(
        self,
        conn: h11.Connection,
        stream: trio.SocketStream,
        model: str,
        answering: Callable[[], Awaitable[bool]],
    ) -> bool:
        """Run `answering` (True: the connection may serve another request) while watching the
        client: one that leaves before the answer is over is noted in `departed` and the answer is
        dropped."""
        request = len(self.log) - 1  # the one just logged
        self.in_flight += 1
        self._tell()
        kept = False  # unless the answer is over before the client leaves
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch, conn, stream, model, request, nursery.cancel_scope)
                try:
                    kept = await answering()
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self._left(conn, model, request)  # found out by writing to it
                nursery.cancel_scope.cancel()
            return kept
        finally:
            self.in_flight -= 1
            self._tell()

    async def _watch(
        self,
        conn: h11.Connection,
        stream: trio.SocketStream,
        model: str,
        request: int,
        answer: trio.CancelScope,
    ) -> None:
        while True:
            try:
                data = await stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                break
            conn.receive_data(data)  # a pipelined request: kept for its turn
        if self._left(conn, model, request):
            answer.cancel()

    def _left(self, conn: h11.Connection, model: str, request: int) -> bool:
        """The client of `conn` left during request number `request`: noted once, unless its
        answer was over (it read it and left)."""
        if conn.our_state in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED) or (
            self.departed and self.departed[-1].request == request
        ):
            return False
        self.departed.append(Departed(at=trio.current_time(), model=model, request=request))
        return True

    async def _perform(
        self,
        conn: h11.Connection,
        stream: trio.SocketStream,
        behaviour: Behaviour,
        request: Mapping[str, Any],
        path: str,
    ) -> bool:
        """Answer one logged request as `behaviour` says; False when the connection must close."""
        model, streamed = str(request.get("model", "")), bool(request.get("stream"))
        if behaviour.delay_s:
            await trio.sleep(behaviour.delay_s)
        kind = behaviour.kind
        if kind == "quota":
            behaviour = self._quota(model, behaviour)
            kind = behaviour.kind
        if kind == "hang":
            await trio.sleep_forever()
        if kind == "reset":
            stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return False
        if kind == "status":
            await _send_json(conn, stream, behaviour.status, behaviour.body, behaviour.headers)
            return True
        if kind == "raw":
            return await _send_raw(conn, stream, behaviour)
        reported = behaviour.reported_model or model
        messages = request.get("messages") or [{}]
        if (
            kind in ("answer", "malformed", "no_done")
            and isinstance(messages[-1], dict)
            and messages[-1].get("role") == "assistant"
        ):
            prefix = str(messages[-1].get("content") or "")
            if not self.prefill:
                refused = "assistant message prefill is not supported"
                error = {"message": refused, "code": "invalid_request"}
                await _send_json(conn, stream, 400, {"error": error}, {})
                return True
            behaviour = attrs.evolve(behaviour, text=behaviour.text.removeprefix(prefix))
        embeddings = path.rstrip("/").endswith("/embeddings")
        if not streamed or embeddings:
            return await _send_completion(
                conn, stream, behaviour, reported, request, embeddings=embeddings
            )
        return await _send_stream(conn, stream, behaviour, reported, request)

    def _quota(self, model: str, b: Behaviour) -> Behaviour:
        now = trio.current_time()
        index, day = int(now // b.window_s), int(now // 86400)
        seen_index, used = self._windows.get(model, (index, 0))
        used = used if seen_index == index else 0
        seen_day, used_today = self._windows.get(model + "\x00day", (day, 0))
        used_today = used_today if seen_day == day else 0
        reset_s = (index + 1) * b.window_s - now
        if b.day_limit and used_today >= b.day_limit:
            return quota_exceeded(
                attrs.evolve(b, limit=b.day_limit), (day + 1) * 86400 - now, self.wall_offset + now
            )
        if used >= b.limit:
            return quota_exceeded(b, reset_s, self.wall_offset + now)
        used += 1
        self._windows[model] = (index, used)
        self._windows[model + "\x00day"] = (day, used_today + 1)
        return answer(headers=quota_headers(b, b.limit - used, reset_s, self.wall_offset + now))


async def _receive_request(
    conn: h11.Connection, stream: trio.SocketStream
) -> tuple[h11.Request, bytes] | None:
    head, body = None, b""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await stream.receive_some(65536)
            if not data and conn.their_state is h11.IDLE:
                return None
            conn.receive_data(data)
            continue
        if isinstance(event, h11.Request):
            head = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            return (head, body) if head is not None else None
        elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
            return None


def _reported_usage(behaviour: Behaviour, request: Mapping[str, Any], honest: Any) -> Any:
    """What the fake says it billed: the behaviour's own `usage` (a value, or a function of the
    request), else the honest count."""
    if callable(behaviour.usage):
        return behaviour.usage(request)
    return behaviour.usage if behaviour.usage is not None else honest


async def _send(conn: h11.Connection, stream: trio.SocketStream, event: Any) -> None:
    data = conn.send(event)
    if data:
        await stream.send_all(data)


async def _send_json(
    conn: h11.Connection,
    stream: trio.SocketStream,
    code: int,
    body: Any,
    headers: Mapping[str, str],
) -> None:
    if isinstance(body, str | bytes):
        raw, content_type = (body.encode() if isinstance(body, str) else body), "text/plain"
    else:
        raw, content_type = json.dumps(body).encode(), "application/json"
    head = [("content-type", content_type), ("content-length", str(len(raw)))]
    head += [(k, v) for k, v in headers.items()]
    await _send(conn, stream, h11.Response(status_code=code, headers=head))
    await _send(conn, stream, h11.Data(data=raw))
    await _send(conn, stream, h11.EndOfMessage())


async def _send_raw(conn: h11.Connection, stream: trio.SocketStream, behaviour: Behaviour) -> bool:
    names = {k.lower() for k in behaviour.headers}
    head = [] if "content-type" in names else [("content-type", "application/json")]
    head += [(k, v) for k, v in behaviour.headers.items()]
    if behaviour.chunks is None and "content-length" not in names:
        head.append(("content-length", str(len(behaviour.body))))
    await _send(conn, stream, h11.Response(status_code=behaviour.status, headers=head))
    pieces = behaviour.chunks() if behaviour.chunks is not None else [behaviour.body]
    for i, piece in enumerate(pieces):
        if behaviour.chunk_delay_s and i:
            await trio.sleep(behaviour.chunk_delay_s)
        if piece:
            await _send(conn, stream, h11.Data(data=piece))
    await _send(conn, stream, h11.EndOfMessage())
    return True


async def _send_completion(
    conn: h11.Connection,
    stream: trio.SocketStream,
    behaviour: Behaviour,
    model: str,
    request: Mapping[str, Any],
    *,
    embeddings: bool = False,
) -> bool:
    if behaviour.kind == "garbage":
        await _send_json(conn, stream, 200, b"<html>502 Bad Gateway</html>", behaviour.headers)
        return True
    body = (
        answers.embeddings(request, model)
        if embeddings
        else answers.completion(request, behaviour.text, model)
    )
    body["usage"] = _reported_usage(behaviour, request, body["usage"])
    if behaviour.kind in ("cut", "stall"):
        raw = json.dumps(body).encode()
        head = [("content-type", "application/json"), ("content-length", str(len(raw)))]
        await _send(conn, stream, h11.Response(status_code=200, headers=head))
        await _send(conn, stream, h11.Data(data=raw[: len(raw) // 2]))
        if behaviour.kind == "stall":
            await trio.sleep_forever()
        return False
    await _send_json(conn, stream, 200, body, behaviour.headers)
    return True


def stream_events(text: str, model: str) -> list[bytes]:
    """The SSE events of a healthy streamed answer without usage: role, the words, the finish."""
    chunks = answers.chunks({}, text, model)
    for chunk in chunks:
        chunk.pop("usage", None)
    return [b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks]


def _stream_events(behaviour: Behaviour, model: str, request: Mapping[str, Any]) -> Iterator[bytes]:
    """The SSE events of a streamed answer as `behaviour` shapes them, encoded one at a time as
    they are sent (the first goes at once, however long the answer)."""
    answered = answers.choices(request, behaviour.text)
    reported = _reported_usage(behaviour, request, answers.usage(request, answered))
    events: Iterator[bytes] = (
        b"data: " + json.dumps({**c, "usage": reported} if "usage" in c else c).encode() + b"\n\n"
        for c in answers.iter_chunks(request, behaviour.text, model)
    )
    if behaviour.kind == "garbage":
        events = iter([b"data: {not json\n\n"] * 3)
    if (request.get("stream_options") or {}).get("include_usage"):
        usage: dict[str, Any] = {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": model,
            "choices": [],
            "usage": reported,
        }
        events = itertools.chain(events, [b"data: " + json.dumps(usage).encode() + b"\n\n"])
    if behaviour.kind == "malformed":
        bad = b'data: {"choices": [tru\n\n'
        events = itertools.chain(itertools.islice(events, behaviour.after), [bad], events)
    return events


async def _send_stream(
    conn: h11.Connection,
    stream: trio.SocketStream,
    behaviour: Behaviour,
    model: str,
    request: Mapping[str, Any],
) -> bool:
    head = [("content-type", "text/event-stream"), ("cache-control", "no-cache")]
    head += list(behaviour.headers.items())
    await _send(conn, stream, h11.Response(status_code=200, headers=head))
    events = _stream_events(behaviour, model, request)
    fault_at = behaviour.after if behaviour.kind in ("cut", "stall") else None
    for i, event in enumerate(events):
        if i == fault_at:
            if behaviour.kind == "stall":
                await trio.sleep_forever()
            if behaviour.clean:
                await _send(conn, stream, h11.EndOfMessage())
                return True
            return False  # drop the connection mid-body
        if behaviour.chunk_delay_s and i:
            await trio.sleep(behaviour.chunk_delay_s)
        await _send(conn, stream, h11.Data(data=event))
    if behaviour.kind != "no_done":
        await _send(conn, stream, h11.Data(data=b"data: [DONE]\n\n"))
    await _send(conn, stream, h11.EndOfMessage())
    return True


@asynccontextmanager
async def open_fake(
    name: str = "fake",
    *,
    models: tuple[str, ...] = (),
    port: int = 0,
    catalog: list[dict[str, Any]] | None = None,
    wall_offset: float = 0.0,
    keep_bodies: bool = True,
) -> AsyncIterator[FakeProvider]:
    """Run a fake provider on 127.0.0.1 for the block's duration. `catalog`: its model list (else
    one made of its models); `wall_offset`: its wall-clock epoch less trio's clock, for the
    epoch-style resets it sends; `keep_bodies=False`: its log keeps no request bodies (a benchmark
    sending gigabytes)."""
    async with trio.open_nursery() as nursery:
        fake = FakeProvider(name, nursery, port, keep_bodies=keep_bodies)
        fake.catalog, fake.wall_offset = catalog, wall_offset
        for model in models:
            fake.script(model, answer())
        await fake.listen()
        try:
            yield fake
        finally:
            nursery.cancel_scope.cancel()

"""The sidecar speaks HTTP/1.1 only: hypercorn's HTTP/1.1 protocol, with its ways into HTTP/2 shut.

Hypercorn switches a plain-port connection to HTTP/2 when it opens with the HTTP/2 preface (prior
knowledge, `PRI * HTTP/2.0`) or asks `Upgrade: h2c`. Its HTTP/2 escapes what bounds a connection
here: the idle timeout (a connection that sent only the preface and SETTINGS stayed open past 6 s
where HTTP/1.1 closes after `idle_timeout_s`, pinning the connection cap), and one connection per
request (one connection opened 300 streams and reset each at once: 300 upstream requests in flight).
A loopback sidecar gains nothing from HTTP/2 — multiplexing saves round trips a loopback connection
does not have — so it is off rather than bounded twice:

- the HTTP/2 preface is answered with an OpenAI-shaped HTTP/1.1 `505 http_version_not_supported`
  and the connection is closed: an HTTP/2 client fails at once, with a reason, and falls back or
  is reconfigured;
- `Upgrade: h2c` is ignored — the request is answered over HTTP/1.1, as RFC 9110 §7.8 lets a server
  do (hypercorn would answer 101 and switch);
- hypercorn's own protocol errors (a malformed request line, headers over 16 KiB) are answered in
  OpenAI's error shape instead of an empty body.

A connection whose request asks for an upgrade, or that pipelines its next request, is not read
again until its answer is out (h11 pauses it), so a client leaving it is noticed only then: its job
still ends at its deadline, as the job of a client that stays and does not read does.
"""

from __future__ import annotations

import json
from itertools import chain

import h11
from hypercorn.events import Closed, Event
from hypercorn.protocol.h11 import H11Protocol

from lanes._http.errors import error_body

_PROTOCOL_ERRORS = {
    400: ("the request is not valid HTTP/1.1", "bad_request"),
    408: ("the request did not arrive in time", "request_timeout"),
    413: ("the request is too large", "body_too_large"),
    431: ("the request's headers are over 16 KiB", "headers_too_large"),
    505: (
        "this sidecar speaks HTTP/1.1 only (HTTP/2 is off on its port); send HTTP/1.1",
        "http_version_not_supported",
    ),
}


class _HTTP2Refused(Exception):
    """The connection opened with the HTTP/2 preface."""


class HTTP11(H11Protocol):
    """Hypercorn's HTTP/1.1 protocol that never becomes HTTP/2 (see the module docstring)."""

    async def handle(self, event: Event) -> None:
        try:
            await super().handle(event)
        except _HTTP2Refused:
            await self._send_error_response(505)
            await self.send(Closed())

    async def _check_protocol(self, event: h11.Request) -> None:
        """Refuse the HTTP/2 preface; serve everything else, `Upgrade: h2c` included, as HTTP/1.1
        (hypercorn's own raises to switch protocols, after answering an upgrade with 101)."""
        if event.method == b"PRI" and event.target == b"*" and event.http_version == b"2.0":
            raise _HTTP2Refused

    async def _send_error_response(self, status_code: int) -> None:
        """Hypercorn's protocol errors (400, 431, …) with an OpenAI-shaped body."""
        message, code = _PROTOCOL_ERRORS.get(status_code, ("the request was refused", "refused"))
        body = json.dumps(error_body(status_code, message, code)).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        await self._send_h11_event(
            h11.Response(
                status_code=status_code,
                headers=list(chain(headers, self.config.response_headers("h11"))),
            )
        )
        await self._send_h11_event(h11.Data(data=body))
        await self._send_h11_event(h11.EndOfMessage())

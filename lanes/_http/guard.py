"""Who may do what over HTTP, and what a browser page can not forge.

- **Keys.** With no client keys configured, only loopback callers reach the sidecar and they are one
  anonymous client. With keys (`[server.clients]`, `admin_key_env`), every endpoint but `/health`,
  `/ready`, `/metrics`, the page and its favicon needs a known key (`Authorization: Bearer`,
  `x-api-key`, or Google's `x-goog-api-key`; Gemini's routes also take `?key=`); state-changing
  ones — lane switches, approval decisions, grant revocations, the paid terms — need an admin key
  (`admin_key_env`, or a client marked `admin = true`). Keys are compared in constant time.
- **No forgery.** A state-changing request must be `Content-Type: application/json` (a cross-site
  form can not send that without a CORS preflight, which is never granted), and must not come from
  another origin (`Origin`, `Sec-Fetch-Site`). A job (chat, responses, messages, embeddings: it
  may spend quota or money) is refused from another origin or in a form's body type. On a
  loopback bind every request's `Host` must name the loopback, so a DNS-rebinding page can not
  reach the sidecar under its own name.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from collections.abc import Mapping
from urllib.parse import urlsplit

import attrs
from starlette.requests import Request

from lanes._core.config.schema import ADMIN_CLIENT, ServerConfig
from lanes._core.runtime.secrets import read_key

log = logging.getLogger("lanes")

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})
#: The body types a cross-site form (or a no-preflight fetch) can send.
FORM_TYPES = frozenset({"application/x-www-form-urlencoded", "multipart/form-data", "text/plain"})


class RequestRefused(Exception):
    """A request refused before it does anything: status, OpenAI error code, message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


@attrs.frozen(kw_only=True)
class Caller:
    client: str
    admin: bool


def resolved_keys(
    server: ServerConfig, env: Mapping[str, str], *, warn: bool = False
) -> dict[str, Caller]:
    """Key value → who it is, for every configured key whose variable holds a usable key (see
    `read_key`). With `warn`, an unset or malformed one is a log line naming the variable."""
    keys: dict[str, Caller] = {}
    wanted = [(name, c.key_env, c.admin) for name, c in server.clients.items()]
    if server.admin_key_env:
        wanted.append((ADMIN_CLIENT, server.admin_key_env, True))
    for name, variable, admin in wanted:
        value, problem = read_key(env, variable)
        if value is not None:
            keys[value] = Caller(client=name, admin=admin)
        elif warn:
            log.warning("client %s: %s; its requests get 401 until it is fixed", name, problem)
    return keys


def _netloc(origin: str) -> str | None:
    """The host[:port] an `Origin` names, or None when it names none we can read."""
    try:
        return urlsplit(origin).netloc.lower()
    except ValueError:  # e.g. an unclosed IPv6 literal
        return None


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Guard:
    def __init__(self, server: ServerConfig, env: Mapping[str, str], *, bind_host: str) -> None:
        self._keys = resolved_keys(server, env, warn=True)
        # configured keys are required even when none is usable: an unset variable never opens
        # the sidecar to everyone
        self._keyed = bool(server.clients or server.admin_key_env)
        self._loopback_only = is_loopback(bind_host)

    def caller(self, request: Request) -> Caller:
        """Who sent `request`: the anonymous loopback client when no keys are configured."""
        self.check_host(request)
        if not self._keyed:
            return Caller(client="anonymous", admin=True)
        auth = request.headers.get("authorization", "")
        token = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        for header in ("x-api-key", "x-goog-api-key"):  # the Messages API's, Google's SDKs'
            token = token or request.headers.get(header, "").strip()
        found = None
        for key, caller in self._keys.items():  # compare with every key, in constant time
            if hmac.compare_digest(token.encode("utf-8", "replace"), key.encode()):
                found = caller
        if found is None:
            raise RequestRefused(401, "invalid_api_key", "unknown client key")
        return found

    def admin(self, request: Request) -> Caller:
        """The caller of a state-changing request: an admin, sending JSON from no other origin."""
        self.unforged(request)
        caller = self.caller(request)
        if not caller.admin:
            raise RequestRefused(403, "admin_key_required", "this action needs an admin key")
        return caller

    def unforged(self, request: Request) -> None:
        """Refuse what a page of another origin could have sent."""
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media != "application/json":
            raise RequestRefused(
                415, "json_required", "state-changing requests must be application/json"
            )
        self.same_origin(request)

    def sender(self, request: Request) -> Caller:
        """The caller of a job (which may spend quota or money): a known client, from no other
        origin, in no body type a cross-site form can send."""
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media in FORM_TYPES:
            raise RequestRefused(415, "json_required", "a job's body must be application/json")
        self.same_origin(request)
        return self.caller(request)

    def uploader(self, request: Request) -> Caller:
        """The caller of a file upload (multipart): a known client, from no other origin, naming
        a key in `Authorization` or `X-Api-Key` even where no client keys are configured — a
        page of another site can send a multipart form, but not that header."""
        if not (request.headers.get("authorization") or request.headers.get("x-api-key")):
            raise RequestRefused(
                401,
                "key_required",
                "an upload names its key (Authorization or X-Api-Key), even on a sidecar "
                "without client keys",
            )
        self.same_origin(request)
        return self.caller(request)

    def same_origin(self, request: Request) -> None:
        origin = request.headers.get("origin")
        if request.headers.get("sec-fetch-site", "") in ("cross-site", "same-site") or (
            origin is not None and _netloc(origin) != request.headers.get("host", "").lower()
        ):
            raise RequestRefused(
                403, "cross_origin", "cross-origin requests may not change anything"
            )

    def check_host(self, request: Request) -> None:
        """On a loopback bind, refuse a `Host` that is not a loopback name (DNS rebinding)."""
        if not self._loopback_only:
            return
        host = request.headers.get("host", "")
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        if not is_loopback(name.lower()):
            raise RequestRefused(
                421, "misdirected_request", "this sidecar answers only to loopback names"
            )

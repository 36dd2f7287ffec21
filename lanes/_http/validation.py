"""A client's request, checked where it enters: every field the sidecar reads has its type checked,
and anything wrong is a `BadRequest` naming the field — a clean OpenAI-shaped 4xx, never a 500.

The body is strict JSON (`strictjson`: no NaN or infinities, no lone surrogates, nesting at most
64 deep). Fields the sidecar reads — `messages` (role, content and its parts, name), `model`,
`stream`, `stream_options`, `max_tokens` / `max_completion_tokens`, `n`, `tools`, `tool_choice`,
`response_format` — must have their OpenAI types; every other field passes through untouched.
Numeric headers take ASCII digits only (`str.isdigit()` accepts "²"); text headers are bounded and
printable.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from lanes._core.cache.rules import DIRECTIVES
from lanes._core.freetier.headers import go_duration
from lanes._core.freetier.prices import MAX_TOKENS, bounded
from lanes._core.model import strictjson
from lanes._core.model.arrival import counted
from lanes._core.model.job import Job, Privacy
from lanes._core.policy.spend import MAX_CHOICES
from lanes._core.state.terms import CONSENTS, MAX_CEILING_USD, ConsentMode
from lanes._http.departures import arrived_at
from lanes._http.errors import BadRequest

ROLES = {"system", "user", "assistant", "tool", "developer", "function"}
#: the counts the sidecar reads (the output caps; `n`, which the paid quote and the cache read)
COUNTS = {"max_tokens": MAX_TOKENS, "max_completion_tokens": MAX_TOKENS, "n": MAX_CHOICES}
PRIVACY: dict[str, Privacy] = {"any": "any", "zdr": "zdr", "local": "local"}
MAX_MESSAGES = 10_000
MAX_NAME = 256  # model names, cohorts, classes
MAX_DECISION_S = 7 * 86400.0  # an approval lasts at most a week
MAX_KEY = 1024  # a client's own provider key (X-Lanes-Key-<lane>)
BYOK_PREFIX = "x-lanes-key-"  # X-Lanes-Key-<lane>: the client's own key for a byok lane
_DIGITS = re.compile(r"[0-9]{1,12}")
_LABEL = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]{0,254}[\x21-\x7e])?")


def read_json(raw: bytes) -> Any:
    """The body as strict JSON, or `BadRequest` (code `invalid_json`) saying what is wrong where."""
    return read_measured(raw)[0]


def read_measured(raw: bytes) -> tuple[Any, strictjson.Measured | None]:
    """`read_json`, and what the strict parse saw of its numbers (`strictjson.measured`)."""
    try:
        return strictjson.measured(raw)
    except strictjson.JSONRefused as exc:
        raise BadRequest(
            f"the request body is not valid JSON: {exc}", exc.where or None, code="invalid_json"
        ) from None


def digits(value: str | None, name: str, *, low: int, high: int) -> int | None:
    """A numeric header: ASCII digits only, within `low`..`high`; None when absent."""
    if value is None:
        return None
    text = value.strip()
    if not _DIGITS.fullmatch(text) or not low <= int(text) <= high:
        raise BadRequest(f"{name} must be whole digits (0-9) in {low}..{high}", name)
    return int(text)


def label(value: str | None, name: str) -> str | None:
    """A short text header (a cohort, a class): printable ASCII, at most 256 characters."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    if not _LABEL.fullmatch(text):
        raise BadRequest(f"{name} must be printable ASCII, at most {MAX_NAME} characters", name)
    return text


def json_object(raw: bytes) -> dict[str, Any]:
    """A request body that must be a JSON object (strict JSON). Raises BadRequest."""
    return measured_object(raw)[0]


def measured_object(raw: bytes) -> tuple[dict[str, Any], strictjson.Measured | None]:
    """`json_object`, and what the strict parse saw of its numbers (`strictjson.measured`)."""
    body, seen = read_measured(raw)
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body, seen


def parse_job(raw: bytes, headers: Mapping[str, str], client: str) -> tuple[Job, bool]:
    """A Job from an OpenAI chat-completions body and our request headers, its size and digest
    counted from `raw` (`Job.arrived`). Raises BadRequest."""
    body, seen = measured_object(raw)
    model = body.get("model", "auto")
    if not isinstance(model, str) or not model or len(model) > MAX_NAME:
        raise BadRequest(f"'model' must be a non-empty string of at most {MAX_NAME}", "model")
    stream = False if body.get("stream") is None else body["stream"]
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean", "stream")
    params = {k: v for k, v in body.items() if k not in ("messages", "model", "stream")}
    messages = chat_fields(body.get("messages"), params)
    job = Job(messages=messages, params=params, model=model, client=client, **job_headers(headers))
    if seen is None:  # read the long way: sized and encoded as any job is
        return job.arrived(raw), stream
    return job.arrived(raw, size=counted(raw, seen), plain=not seen.floats), stream


def chat_fields(messages: Any, params: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Check a chat's messages and the params the sidecar reads (every door's job, translated or
    not, passes here); the messages, checked. Raises BadRequest."""
    _params(params)
    return _messages(messages)


def job_headers(headers: Mapping[str, str]) -> dict[str, Any]:
    """The `Job` fields our request headers set: deadline, cohort, class, approval, the client's
    own keys, privacy, how long it may wait for a free quota (`X-Lanes-Max-Wait`, seconds), and
    the W3C `traceparent` (a malformed one is ignored, never refused).
    Raises BadRequest."""
    pairs = list(headers.items())
    headers = {}  # one pass (the first of a repeated header wins, as a lookup gives it), then a
    for name, value in pairs:  # plain dict for the lookups: most of them find nothing
        headers.setdefault(name, value)
    deadline_ms = digits(
        headers.get("x-lanes-deadline-ms"), "X-Lanes-Deadline-Ms", low=1, high=3_600_000
    )
    privacy = headers.get("x-lanes-privacy", "any").strip().lower()
    if privacy not in PRIVACY:
        raise BadRequest("X-Lanes-Privacy must be any, zdr or local", "X-Lanes-Privacy")
    approval = label(headers.get("x-lanes-approval"), "X-Lanes-Approval")
    max_wait = digits(headers.get("x-lanes-max-wait"), "X-Lanes-Max-Wait", low=1, high=3600)
    deadline_s = deadline_ms / 1000 if deadline_ms is not None else None
    arrived = arrived_at() if deadline_s is not None else None
    return {
        "cache": cache_directive(headers),
        "deadline_s": deadline_s,
        "deadline_at": arrived + deadline_s if arrived is not None and deadline_s else None,
        "cohort": label(headers.get("x-lanes-cohort"), "X-Lanes-Cohort"),
        "request_class": label(headers.get("x-lanes-class"), "X-Lanes-Class"),
        "approval": approval[:64] if approval else None,
        "keys": byok_keys(pairs),
        "privacy": PRIVACY[privacy],
        "traceparent": headers.get("traceparent"),  # the Job keeps it when valid, else ignores it
        "max_wait_s": None if max_wait is None else float(max_wait),
    }


def cache_directive(headers: Mapping[str, str]) -> str | None:
    """What a request asks of the response cache: `X-Lanes-Cache` (on, off, refresh), else
    `Cache-Control: no-store` (off) or `no-cache` (refresh); None: the cache's own rules.
    Raises BadRequest for another `X-Lanes-Cache`."""
    asked = headers.get("x-lanes-cache")
    if asked is not None:
        word = asked.strip().lower()
        if word not in DIRECTIVES:
            raise BadRequest("X-Lanes-Cache must be on, off or refresh", "X-Lanes-Cache")
        return word
    control = headers.get("cache-control")
    if control is None:
        return None
    # read whole (the server bounds a header's size): a no-store after other directives counts
    words = {part.strip().lower().partition("=")[0] for part in control.split(",")}
    return "off" if "no-store" in words else "refresh" if "no-cache" in words else None


def byok_keys(headers: Mapping[str, str] | list[tuple[str, str]]) -> dict[str, str]:
    """The provider keys a request brings for bring-your-own-key lanes (header X-Lanes-Key-<lane>).
    Refused (400, naming the header, never the value) unless one printable key."""
    keys = {}
    for name, value in headers.items() if isinstance(headers, Mapping) else headers:
        if name.lower().startswith(BYOK_PREFIX):
            lane, key = name.lower()[len(BYOK_PREFIX) :], value.strip()
            if not key or len(key) > MAX_KEY or not key.isascii() or not key.isprintable():
                raise BadRequest(f"{name} must hold one printable key", name)
            keys[lane] = key
    return keys


def _messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty array", "messages")
    if len(messages) > MAX_MESSAGES:
        raise BadRequest(f"'messages' holds more than {MAX_MESSAGES} messages", "messages")
    for i, message in enumerate(messages):  # (a field is named only when it is wrong: a 512 KB
        role = message.get("role") if isinstance(message, dict) else None  # body has 500 of them)
        if not isinstance(role, str) or role not in ROLES:
            _refuse_role(message, f"messages[{i}]")
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            _content(content, f"messages[{i}].content")
        for key in ("name", "tool_call_id"):
            if message.get(key) is not None and not isinstance(message[key], str):
                raise BadRequest(f"messages[{i}].{key} must be a string", f"messages[{i}].{key}")
        calls = message.get("tool_calls")
        if calls is not None and not (type(calls) is list and all(type(c) is dict for c in calls)):
            _objects(calls, f"messages[{i}].tool_calls")  # or a list of dict subclasses
    return messages


def _refuse_role(message: Any, where: str) -> None:
    """Raise the `BadRequest` for a message that is not an object, or has no role we know."""
    if not isinstance(message, dict):
        raise BadRequest(f"{where} must be an object", where)
    raise BadRequest(f"{where}.role must be one of {', '.join(sorted(ROLES))}", f"{where}.role")


def _content(content: Any, where: str) -> None:
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise BadRequest(f"{where} must be a string or an array", where)
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise BadRequest(f"{at} must be an object with a string 'type'", at)
        if part.get("text") is not None and not isinstance(part["text"], str):
            raise BadRequest(f"{at}.text must be a string", f"{at}.text")
        image = part.get("image_url")
        if (
            image is not None
            and not isinstance(image, str)
            and not (isinstance(image, dict) and isinstance(image.get("url"), str))
        ):
            raise BadRequest(f"{at}.image_url must be a string or an object with a url", at)


def _objects(value: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise BadRequest(f"'{where}' must be an array of objects", where)
    return value


def _params(body: Mapping[str, Any]) -> None:
    """The other fields the sidecar reads: their types, and bounds on token counts."""
    for key, most in COUNTS.items():
        value = body.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= most
        ):
            raise BadRequest(f"'{key}' must be a whole number in 1..{most}", key)
    if body.get("tools") is not None:
        for i, tool in enumerate(_objects(body["tools"], "tools")):
            function = tool.get("function")
            if not isinstance(tool.get("type"), str) or (
                function is not None
                and not (isinstance(function, dict) and isinstance(function.get("name"), str))
            ):
                raise BadRequest(
                    f"tools[{i}] must have a string 'type' and a named function", f"tools[{i}]"
                )
    choice = body.get("tool_choice")
    if choice is not None and not isinstance(choice, (str, dict)):
        raise BadRequest("'tool_choice' must be a string or an object", "tool_choice")
    for key in ("response_format", "stream_options"):
        value = body.get(key)
        if value is not None and not isinstance(value, dict):
            raise BadRequest(f"'{key}' must be an object", key)
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and not isinstance(response_format.get("type"), str):
        raise BadRequest("'response_format.type' must be a string", "response_format.type")


def parse_decision(value: Any) -> Literal["once", "deny"] | float:
    """ "once", "deny", seconds, or a duration such as "1h" / "30m" (seconds returned), at most
    a week."""
    if value == "once":
        return "once"
    if value == "deny":
        return "deny"
    seconds: float | None = None
    if isinstance(value, (int, float)):
        seconds = bounded(value, 0.0, MAX_DECISION_S)
    elif isinstance(value, str) and len(value) <= 32:
        seconds = go_duration(value)
    if seconds is not None and 0 < seconds <= MAX_DECISION_S:
        return seconds
    raise BadRequest(
        '\'decision\' must be "once", "deny" or a duration up to a week such as "1h"', "decision"
    )


def parse_terms(body: Mapping[str, Any]) -> tuple[float | None, ConsentMode | None]:
    """`POST /v1/ceiling`: {"usd": the daily paid ceiling, "consent": a consent mode}, either or
    both — (usd, consent). A ceiling must be a number from 0 to MAX_CEILING_USD."""
    usd, consent = body.get("usd"), body.get("consent")
    if usd is None and consent is None:
        raise BadRequest("give 'usd' (the daily paid ceiling) or 'consent', or both", "usd")
    if usd is not None and (
        isinstance(usd, bool)
        or not isinstance(usd, int | float)
        or not 0 <= usd <= MAX_CEILING_USD  # NaN fails this too
    ):
        raise BadRequest(f"'usd' must be a number from 0 to {MAX_CEILING_USD:g}", "usd")
    chosen = next((c for c in CONSENTS if c == consent), None)
    if consent is not None and chosen is None:
        raise BadRequest(f"'consent' must be one of {', '.join(CONSENTS)}", "consent")
    return (None if usd is None else float(usd)), chosen

"""Keys: checked where they are read, and kept out of every log line the process writes.

`read_key(env, variable)` is the one way a provider, client or admin key enters: surrounding
whitespace is stripped (a key file saved on Windows ends in `\\r\\n`), and a key with anything left
inside that is not printable ASCII is refused with a reason that names the variable, never the
value. Every key read is remembered for redaction.

`install_log_redaction()` puts a record factory in front of the `logging` module's, so every record
any logger creates — ours, the HTTP libraries', at any level, through any handler — has
`Authorization` and `x-api-key` values, `Bearer …` tokens and every key read here replaced by
`[redacted]` before a handler sees it, exception and stack text included.

A key that arrives with a request (a client's own provider key, `X-Lanes-Key-<lane>`) is not
remembered for ever: `with request_secrets(keys):` redacts it from every record made in that
context — the request's task and the tasks it starts — until the block ends.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from lanes._core.model.untrusted import REDACTED, forms, keylike

_PRINTABLE = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?")
# A header-shaped secret wherever a library might print one: `Authorization: Bearer x`,
# `'x-api-key': 'x'`, `(b'authorization', b'x')`, `authorization=x`. The value runs to the next
# quote, comma, bracket or line end.
_HEADER = re.compile(
    r"(?i)\b((?:proxy-)?authorization|x-api-key|api-key)(['\"]?\s*[:=,]\s*b?['\"]?)"
    r"([^'\",)}\]\r\n]+)"
)
_BEARER = re.compile(r"(?i)\bBearer\s+[^\s'\",)}\]]+")
_lock = threading.Lock()
_secrets: tuple[str, ...] = ()  # replaced, never mutated: a logging thread may be reading it
#: The keys of the request being served in this context (longest first).
_request: ContextVar[tuple[str, ...]] = ContextVar("lanes_request_secrets", default=())


def read_key(env: Mapping[str, str], variable: str) -> tuple[str | None, str]:
    """(key, "") for a usable key in `env[variable]`, else (None, why) — the reason names the
    variable and never shows the value. The key is remembered for log redaction."""
    raw = env.get(variable)
    if keylike(variable):  # a key pasted where its variable's name goes: never shown, anywhere
        remember(variable)
        if raw is None or not raw.strip():
            return None, (
                "the variable named by api_key_env is not set, and its name reads like a key: "
                "put the key in the environment and the variable's name in the config"
            )
    if raw is None or not raw.strip():
        return None, f"{variable} is not set"
    value = raw.strip()
    if not _PRINTABLE.fullmatch(value):
        where = next(i for i, ch in enumerate(value) if not "\x20" <= ch <= "\x7e")
        return None, (
            f"{variable} holds a control or non-printable character (at position {where} after "
            "stripping surrounding whitespace); a key is printable ASCII — fix the variable"
        )
    remember(value)
    return value, ""


def remember(secret: str) -> None:
    """Redact `secret` (and its escaped forms) from every log record from now on."""
    global _secrets
    known = forms(secret)
    if not known:
        return
    with _lock:
        _secrets = tuple(sorted(set(_secrets) | known, key=len, reverse=True))


@contextmanager
def request_secrets(keys: Iterable[str]) -> Iterator[None]:
    """Redact `keys` (a request's own keys) from every log record made in this context until the
    block ends."""
    known = {form for key in keys for form in forms(key)}
    if not known:
        yield
        return
    token = _request.set(tuple(sorted(known | set(_request.get()), key=len, reverse=True)))
    try:
        yield
    finally:
        _request.reset(token)


def redact_log(text: str) -> str:
    """`text` without header-shaped secrets, bearer tokens, any remembered key or the keys of the
    request being served."""
    for secret in (*_request.get(), *_secrets):
        if secret in text:
            text = text.replace(secret, REDACTED)
    text = _HEADER.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)
    return _BEARER.sub(f"Bearer {REDACTED}", text)


_previous_factory: Any = None


def install_log_redaction() -> None:
    """Redact every log record the process creates from now on (idempotent)."""
    global _previous_factory
    with _lock:
        if _previous_factory is not None:
            return
        _previous_factory = logging.getLogRecordFactory()
        logging.setLogRecordFactory(_redacting_factory)


def _redacting_factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
    record: logging.LogRecord = _previous_factory(*args, **kwargs)
    try:
        _scrub(record)
    except Exception:  # redaction must never break logging: drop what could not be checked
        record.msg, record.args, record.exc_info, record.exc_text = (
            "(a log message that could not be checked for secrets was dropped)",
            (),
            None,
            None,
        )
    return record


def _scrub(record: logging.LogRecord) -> None:
    try:
        message = record.getMessage()
    except Exception:  # arguments that do not format: keep the template, never the arguments
        message = f"{record.msg} (arguments dropped: they did not format)"
        record.args = ()
    clean = redact_log(message)
    if clean != message or not record.args:
        record.msg, record.args = clean, ()
    if record.exc_info and not record.exc_text:
        record.exc_text = redact_log(logging.Formatter().formatException(record.exc_info))
    if record.stack_info:
        record.stack_info = redact_log(record.stack_info)

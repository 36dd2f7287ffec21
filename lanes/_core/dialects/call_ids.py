"""A tool call's `extra_content`, carried in the id a client is given for it. Pure.

Gemini 3 signs each tool call it makes (`extra_content: {"google": {"thought_signature": …}}` on
the chat completions call) and refuses, with a 400, the next request whose assistant turn sends
that call back without it. A chat client keeps the field; a Messages client (Claude Code) keeps
only the `tool_use` block's `id`, a Responses client (Codex) only the `function_call`'s `call_id`.
So the id lanes gives such a client carries the extra content, and the id the client sends back
gives the upstream's own id and its extra content again, exactly:

    minted("function-call-1", {"google": {"thought_signature": "c2ln"}})
    == "function-call-1_eyJnb29nbGUiOnsidGhvdWdodF9zaWduYXR1cmUiOiJjMmxuIn19_xc52"

— the upstream's id, `_`, the extra content as compact JSON in unpadded base64url, `_xc` and
that payload's length in decimal. Read from the right, the form is unambiguous whatever the
upstream's id holds, and it adds only `[A-Za-z0-9_-]`: an upstream id that matches the Messages
API's `^[a-zA-Z0-9_-]+$` still does.

Liberal in: an id that is not exactly that form — a client's own, one lanes did not mint, a
payload that is not canonical base64url of a JSON object — is the call's id as it is, with no
extra content; it is never an error. Bounded: a payload over `MAX_PAYLOAD` characters (16 KiB,
room for a signature of about 12 KB of base64) is not carried — the client gets the upstream's id
alone, and the next turn goes upstream without that call's extra content — and an id claiming a
longer one is read as a client's own.
"""

from __future__ import annotations

# lanes: pure
import base64
import binascii
import json
import re
from collections.abc import Mapping
from typing import Any

#: The longest payload carried (base64url characters). Claude Code sends every id back on every
#: later request, twice (the `tool_use` and its `tool_result`): an id is bounded by what one call
#: may add to each of them.
MAX_PAYLOAD = 16 * 1024
_TAIL = re.compile(r"xc([1-9][0-9]{0,4})")  # what follows the id's last `_`


def _payload(extra: Mapping[str, Any]) -> str:
    text = json.dumps(extra, separators=(",", ":"))  # ASCII: a lone surrogate survives too
    return base64.urlsafe_b64encode(text.encode("ascii")).decode("ascii").rstrip("=")


def minted(call_id: str, extra: Any) -> str:
    """The id a client is given for the upstream's call `call_id` whose `extra_content` is
    `extra`: `call_id` itself when there is nothing to carry (no extra content, or not a
    non-empty object) or too much (a payload over `MAX_PAYLOAD`)."""
    if not isinstance(extra, Mapping) or not extra:
        return call_id
    payload = _payload(extra)
    if len(payload) > MAX_PAYLOAD:
        return call_id
    return f"{call_id}_{payload}_xc{len(payload)}"


def restored(client_id: str) -> tuple[str, dict[str, Any] | None]:
    """(the upstream's id, its `extra_content` or None) for an id a client sent back: what
    `minted` was given, or `(client_id, None)` for an id it did not make."""
    if "_xc" not in client_id:  # not one `minted` made (the form says `_xc` before its length)
        return client_id, None
    head, _, tail = client_id.rpartition("_")
    found = _TAIL.fullmatch(tail)
    if found is None:
        return client_id, None
    length = int(found.group(1))
    if length > MAX_PAYLOAD or len(head) <= length or head[-length - 1] != "_":
        return client_id, None
    payload = head[-length:]
    extra = _extra(payload)
    if extra is None:
        return client_id, None
    return head[: -length - 1], extra


def _extra(payload: str) -> dict[str, Any] | None:
    """The JSON object `payload` encodes, when it is exactly what `_payload` makes of it."""
    try:
        raw = base64.b64decode(payload + "=" * (-len(payload) % 4), altchars=b"-_", validate=True)
        extra = json.loads(raw)
    except (binascii.Error, ValueError, RecursionError):
        return None
    if not isinstance(extra, dict) or not extra or _payload(extra) != payload:
        return None
    return extra

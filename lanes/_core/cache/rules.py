"""The response cache's rules, apart from where entries are kept: what a request does with the
cache (`CachePlan`), what its key is, which answers may be stored, and how an answer is taken from a
stream and given back as one. Pure.

- **The key** is a SHA-256 of the whole request as the chat-completion core has it — the client
  key, the provider keys it brought (`X-Lanes-Key-<lane>`, by digest), the model (or alias) as
  asked, the messages, every parameter but `stream` and `stream_options`, a translated reasoning
  effort — so one client's answer is never another's, an answer a provider key paid for is
  served only with that key, and a request asked on another door (Messages, Responses, Gemini)
  finds the same entry.
- **Cacheable**: a chat request (never an embedding) with privacy `any`, that asks for determinism
  (`temperature` 0 or a `seed`), or that opts in (`X-Lanes-Cache: on`), or any with
  `[cache] any_sampling`.
- **Storable**: a whole success — every choice has its `finish_reason` (not `error`), no `error`
  in the body or a choice, nothing in a message the replay could not give back; a paid answer
  only with `keep_paid`.
"""

from __future__ import annotations

# lanes: pure
import hashlib
import json
from collections.abc import Mapping
from typing import Any, Literal

import attrs
import msgspec

from lanes._core.config.schema import CacheMode
from lanes._core.model.candidates import Tier
from lanes._core.model.job import Job, digest

#: What a request asks of the cache (`X-Lanes-Cache`; `Cache-Control: no-cache` is `refresh`).
Directive = Literal["on", "off", "refresh"]
Status = Literal["hit", "miss", "bypass"]
DIRECTIVES: tuple[Directive, ...] = ("on", "off", "refresh")

_ENCODE = msgspec.json.Encoder().encode
#: Bumped when what the key is made of changes: older entries are then never found.
KEY_VERSION = 3
#: Parameters that say how an answer is delivered, not what it is.
UNKEYED = frozenset({"stream", "stream_options"})
#: A message's fields an entry can give back, streamed or not (others must be null or empty).
MESSAGE_FIELDS = ("content", "refusal", "reasoning_content", "reasoning")
_MESSAGE_KNOWN = frozenset({"role", "tool_calls", *MESSAGE_FIELDS})
_TOOL_CALL_KNOWN = frozenset({"id", "type", "function", "index", "extra_content"})


@attrs.frozen
class CachePlan:
    """What one request does with the cache: read it, write its answer; and what the answer's
    `X-Lanes-Cache` says when it was not a hit (None: the cache is off for it, no header)."""

    read: bool
    write: bool
    status: Status | None

    @property
    def used(self) -> bool:
        return self.read or self.write


OFF = CachePlan(read=False, write=False, status=None)
BYPASS = CachePlan(read=False, write=False, status="bypass")


def deterministic(params: Mapping[str, Any]) -> bool:
    """Whether a request asks for the same answer each time: `temperature` 0, or a `seed`."""
    temperature = params.get("temperature")
    seed = params.get("seed")
    zero = isinstance(temperature, int | float) and not isinstance(temperature, bool)
    return (zero and temperature == 0) or (isinstance(seed, int) and not isinstance(seed, bool))


def plan(mode: CacheMode, job: Job, *, any_sampling: bool) -> CachePlan:
    """What `job` does with a cache in `mode` (the client's), given what it asked (`job.cache`)."""
    if mode == "off":
        return OFF
    asked = job.cache
    if asked == "off" or job.embedding or job.privacy != "any":
        return BYPASS
    if asked is None and not any_sampling and not deterministic(job.params):
        return BYPASS
    read = asked == "on" if mode == "write_only" else asked != "refresh"
    return CachePlan(read=read, write=True, status="miss")


def choices_asked(job: Job) -> int:
    """How many choices `job` asks for (`n`; 1 unless a whole number says otherwise)."""
    n = job.params.get("n")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1


def cache_key(job: Job) -> str:
    """The entry's key for `job` (see the module's doc): a SHA-256 of what was asked, written by
    msgspec (a tenth of `json.dumps`'s time at 512 KB; keys in the order they came, so a client
    that reorders them misses, never collides), else by `digest` for what msgspec can not write.
    Not the job's `fingerprint`: for a request a door read, that is its body as it arrived, which
    holds `stream` — and a streamed request and a whole one must find the same entry."""
    params = {k: v for k, v in job.params.items() if k not in UNKEYED}
    asked = [KEY_VERSION, job.client, _own_keys(job), job.model, list(job.messages), params]
    asked.append(job.reasoning_effort)
    try:
        return hashlib.sha256(_ENCODE(asked)).hexdigest()
    except (msgspec.MsgspecError, TypeError, ValueError, RecursionError, OverflowError):
        return digest(asked)[0]


def _own_keys(job: Job) -> list[tuple[str, str]]:
    """The provider keys `job` brought, by lane, each as its SHA-256: an answer made with one is
    that key's (it paid, and may reach models another key may not), never a keyless request's."""
    own = job.keys.items()
    return sorted((lane, hashlib.sha256(key.encode()).hexdigest()) for lane, key in own)


def storable_route(route: str, *, keep_paid: bool) -> bool:
    return route != "paid_fallback" or keep_paid


def servable(route: str, job: Job, *, keep_paid: bool) -> bool:
    """Whether an entry made on `route` may answer `job`: a paid answer only while `keep_paid`
    holds, and never to work that may not pay (`free_only`)."""
    return route != "paid_fallback" or (keep_paid and not job.free_only)


def tier_of(route: str) -> Tier:
    """The tier an entry's route was served from."""
    return {"local": "local", "byok": "byok", "paid_fallback": "paid"}.get(route, "free")  # type: ignore[return-value]


def whole(body: Any, choices_asked: int | None = None) -> bool:
    """Whether a chat completion is a whole success an entry can give back in any form: choices
    (as many as asked, when said), each with its `finish_reason` and a message of known fields;
    no `error`."""
    if not isinstance(body, Mapping) or "error" in body:
        return False
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        return False
    if choices_asked is not None and len(choices) != choices_asked:
        return False
    return all(_whole_choice(choice) for choice in choices)


def _whole_choice(choice: Any) -> bool:
    if not isinstance(choice, Mapping) or not isinstance(choice.get("index", 0), int):
        return False
    reason, message = choice.get("finish_reason"), choice.get("message")
    if not _finished(reason) or choice.get("error") is not None:
        return False
    if not isinstance(message, Mapping):
        return False
    if choice.get("logprobs") not in (None, {}):
        return False  # a stream's replay does not carry them
    if any(v not in (None, [], {}) for k, v in message.items() if k not in _MESSAGE_KNOWN):
        return False
    calls = message.get("tool_calls")
    if calls in (None, []):
        return True
    return isinstance(calls, list) and all(_whole_call(call) for call in calls)


def _finished(reason: Any) -> bool:
    """A finish reason of a whole answer: OpenRouter's `error` says the answer broke (its error
    beside it, in the choice, inside a 200)."""
    return isinstance(reason, str) and bool(reason) and reason != "error"


def _whole_call(call: Any) -> bool:
    if not isinstance(call, Mapping) or not set(call) <= _TOOL_CALL_KNOWN:
        return False
    function = call.get("function")
    return isinstance(function, Mapping) and isinstance(function.get("name"), str)


class Assembler:
    """A streamed answer put together as the chat completion it stands for, chunk by chunk, up to
    `limit` bytes (beyond, or on a chunk it can not give back, it gives up: `body()` is None)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._size = 0
        self._head: dict[str, Any] = {}
        self._choices: dict[int, dict[str, Any]] = {}
        self._raws: list[str] = []  # each chunk's `data`, as the caller was handed it
        self.failed = False

    def add(self, chunk: Mapping[str, Any], raw: str | None) -> None:
        """One chunk as the caller was handed it, with its `data` as the upstream sent it (None:
        encoded here)."""
        if self.failed:
            return
        data = raw if raw is not None else json.dumps(chunk, separators=(",", ":"))
        self._raws.append(data)
        self._size += len(data)
        if self._size > self._limit or not isinstance(chunk.get("choices", []), list):
            self.failed = True
            return
        for name in ("id", "created", "model", "system_fingerprint"):
            if name in chunk and name not in self._head:
                self._head[name] = chunk[name]
        for choice in chunk.get("choices") or ():
            if not self._choice(choice):
                self.failed = True
                return

    def _choice(self, choice: Any) -> bool:
        if not isinstance(choice, Mapping) or not isinstance(choice.get("index", 0), int):
            return False
        if choice.get("logprobs") not in (None, {}) or choice.get("error") is not None:
            return False
        index = choice.get("index", 0)
        kept = self._choices.setdefault(index, {"index": index, "message": {"role": "assistant"}})
        if isinstance(reason := choice.get("finish_reason"), str) and reason:
            kept["finish_reason"] = reason
        delta = choice.get("delta") or {}
        if not isinstance(delta, Mapping):
            return False
        return _into(kept["message"], delta)

    def body(self, usage: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """The chat completion streamed, or None when it can not be given back whole."""
        if self.failed or not self._choices:
            return None
        body: dict[str, Any] = {"id": self._head.get("id", ""), "object": "chat.completion"}
        body.update({k: v for k, v in self._head.items() if k != "id"})
        body["choices"] = [self._choices[i] for i in sorted(self._choices)]
        if usage is not None:
            body["usage"] = dict(usage)
        return body if whole(body) else None

    def kept(self, usage: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """What an entry keeps of the stream: the chat completion it stands for, and its chunks as
        handed over (a streamed hit replays them); None when it can not be given back whole."""
        body = self.body(usage)
        return None if body is None else {"completion": body, "stream": list(self._raws)}


def _into(message: dict[str, Any], delta: Mapping[str, Any]) -> bool:
    """Add one delta to the message being put together; False for one it can not hold."""
    for name, value in delta.items():
        if name == "role" or value is None:
            continue
        if name in MESSAGE_FIELDS and isinstance(value, str):
            message[name] = message.get(name, "") + value
        elif name == "tool_calls" and isinstance(value, list):
            calls = message.setdefault("tool_calls", [])
            if not all(_call_into(calls, part) for part in value):
                return False
        else:
            return False
    return True


def _call_into(calls: list[dict[str, Any]], part: Any) -> bool:
    """Add one tool-call delta; False for one it can not hold — among them an `index` that is
    neither a call begun nor the next one (a stream's own index never sizes anything)."""
    index = part.get("index", 0) if isinstance(part, Mapping) else None
    if not isinstance(index, int) or not 0 <= index <= len(calls):
        return False
    if index == len(calls):
        calls.append({"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
    call, function = calls[index], part.get("function") or {}
    if not isinstance(function, Mapping):
        return False
    for name in ("id", "type"):
        if isinstance(part.get(name), str):
            call[name] = part[name]
    if "extra_content" in part:
        call["extra_content"] = part["extra_content"]
    for name in ("name", "arguments"):
        if isinstance(function.get(name), str):
            call["function"][name] += function[name]
    return True


def replayed(body: Mapping[str, Any], response_id: str) -> dict[str, Any]:
    """An entry's chat completion as a hit answers it: the original's, with a fresh id."""
    return {**body, "id": response_id}


def streamed_again(
    kept: Mapping[str, Any], response_id: str, *, usage: bool
) -> list[tuple[dict[str, Any], str]]:
    """An entry as a streamed hit hands it over, each chunk with its `data`: a stream's own chunks
    when it was kept from one (their id the hit's; the usage chunk as this request asks), else
    the chat completion as chunks (`chunks_of`)."""
    body, stream = kept["completion"], kept.get("stream")
    if not isinstance(stream, list):
        chunks = chunks_of(body, response_id, usage=usage)
        return [(c, json.dumps(c, separators=(",", ":"), ensure_ascii=False)) for c in chunks]
    old = json.dumps(body.get("id", ""))
    out, told = [], False
    for data in stream:
        data = data.replace(old, json.dumps(response_id), 1) if old != '""' else data
        chunk = json.loads(data)
        if not isinstance(chunk, dict):
            raise ValueError("a kept chunk that is not an object")
        if not chunk.get("choices") and "usage" in chunk:
            told = True
            if not usage:
                continue
        out.append((chunk, data))
    if usage and not told and isinstance(body.get("usage"), Mapping):
        extra = chunks_of(body, response_id, usage=True)[-1]
        out.append((extra, json.dumps(extra, separators=(",", ":"), ensure_ascii=False)))
    return out


def chunks_of(body: Mapping[str, Any], response_id: str, *, usage: bool) -> list[dict[str, Any]]:
    """An entry's chat completion as the chunks of a stream: per choice, the role with its text,
    its tool calls, its finish; then the usage when the request asked for it."""
    head: dict[str, Any] = {"id": response_id, "object": "chat.completion.chunk"}
    head.update({k: body[k] for k in ("created", "model", "system_fingerprint") if k in body})
    chunks = []
    for choice in body["choices"]:
        index, message = choice.get("index", 0), choice["message"]
        delta = {"role": "assistant"}
        delta.update({k: message[k] for k in MESSAGE_FIELDS if message.get(k) is not None})
        chunks.append({**head, "choices": [{"index": index, "delta": delta}]})
        if calls := message.get("tool_calls"):
            parts = [{**call, "index": i} for i, call in enumerate(calls)]
            chunks.append({**head, "choices": [{"index": index, "delta": {"tool_calls": parts}}]})
        done = {"index": index, "delta": {}, "finish_reason": choice["finish_reason"]}
        chunks.append({**head, "choices": [done]})
    if usage and isinstance(body.get("usage"), Mapping):
        chunks.append({**head, "choices": [], "usage": body["usage"]})
    return chunks

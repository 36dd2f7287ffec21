"""The replay's providers: one in-process transport standing in for every lane of a config, with
the quotas and prices that config declares — so `lanes whatif` runs the real dispatcher, its real
pool, parsers and ledger, without a socket.

Each lane's base URL is rewritten to `http://<n>.whatif.invalid/v1` (a name that never resolves:
nothing here connects anywhere); the transport finds the lane by that host and answers:

- `POST …/chat/completions` and `…/embeddings`: the recorded job's usage (the job's index rides
  in its synthetic prompt), after the recorded latency (virtual time), or — over a quota — a 429
  with `Retry-After` to the window's end; a credit lane past its budget answers 402;
- `GET …/models`: the lane's configured models and those the audit saw it serve; `GET …/key`: an
  OpenRouter-shaped balance (the credit budget left).

Quotas count in fixed UTC windows (minute, day, calendar month), by the scope the lane's free tier
names (the lane when account-wide, else each model), requests and tokens both. A local lane is
always up; a lane whose limits its config does not state is never refused (the report says so).
With faults, the outages the audit recorded are answered again for as long as they were observed
(`Fault`).
"""

from __future__ import annotations

import fnmatch
import functools
import json
import re
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import attrs
import httpx2
import trio

from lanes._core.freetier.windows import UsageCounter, WindowName, window_end
from lanes.testing.answers import completion_cap

#: How long a recorded 429 is answered again on its model, seconds (a replay of `--faults`): the
#: audit keeps no reset time.
FAULT_S = 20.0
#: The longest synthetic prompt, in tokens (about 4 bytes each): bounds a replay's memory.
MAX_PROMPT_TOKENS = 200_000
_INDEX = re.compile(r"\[whatif (\d+)\]")


@attrs.frozen(kw_only=True)
class Ask:
    """What a replayed job sends and is answered with: no body, only its shape."""

    prompt_tokens: int
    completion_tokens: int
    latency_s: float


@attrs.frozen(kw_only=True)
class Fault:
    """An outage the audit recorded on a lane (or one of its models, for a 429): every request
    from `at` until `until` (epoch seconds) is answered with its failure (`recorded.py` reads
    them)."""

    at: float  # epoch seconds
    until: float  # epoch seconds
    lane: str
    model: str
    kind: str  # "rate_limited", "connect", "reset", "server_error", "credit_exhausted"


@attrs.frozen(kw_only=True)
class Limits:
    """A quota scope's limits (None: none stated)."""

    rpm: int | None = None
    rpd: int | None = None
    rpmonth: int | None = None
    tpm: int | None = None
    tpd: int | None = None
    tpmonth: int | None = None

    @property
    def stated(self) -> bool:
        return any(v is not None for v in attrs.astuple(self))


@attrs.frozen(kw_only=True)
class SimLane:
    """One lane as the replay's provider sees it."""

    name: str
    kind: str  # the free-tier kind: local, rate_limited, free_models, credits, none, subscription
    limits: Limits = Limits()
    account_wide: bool = False
    free_patterns: tuple[str, ...] = ()  # free_models: which models are free (others are paid)
    budget_usd: float | None = None  # credits
    prices: Mapping[str, tuple[float, float]] = attrs.field(factory=dict)  # model → $/Mtok in, out
    models: tuple[str, ...] = ()  # what GET /models lists

    def scope(self, model: str) -> str:
        return self.name if self.account_wide else f"{self.name}/{model}"

    def limited(self, model: str) -> bool:
        """Whether this model's requests count against a stated quota."""
        if self.kind in ("local", "none", "subscription") or not self.limits.stated:
            return False
        if self.kind == "free_models":
            return any(fnmatch.fnmatchcase(model, p) for p in self.free_patterns)
        return True


def host_of(index: int) -> str:
    return f"lane-{index}.whatif.invalid"


def prompt_for(index: int, prompt_tokens: int) -> str:
    """A synthetic prompt of about `prompt_tokens` tokens (lanes estimates 4 bytes a token)
    naming the job's index: nothing of the recorded prompt (an embedding's input)."""
    head = index_line(index) + " "
    return head + padding(max(0, prompt_tokens - len(head) // 4))


def index_line(index: int) -> str:
    """What names a replayed job to its provider (a chat's first message)."""
    return f"[whatif {index}]"


@functools.lru_cache(maxsize=512)
def padding(prompt_tokens: int) -> str:
    """About `prompt_tokens` tokens of filler (at most `MAX_PROMPT_TOKENS`), one string shared by
    every job of that size: jobs in flight hold a reference, not a copy each."""
    tokens = max(0, min(prompt_tokens, MAX_PROMPT_TOKENS))
    return "x" * max(0, 4 * tokens - 48)


class Quotas:
    """Requests and tokens counted per scope in the current minute, day and month: the
    FreeTierManager's own counter and UTC windows (`freetier/windows.py`)."""

    def __init__(self) -> None:
        self._counted = UsageCounter()

    def admit(self, scope: str, limits: Limits, wall: float, tokens: int) -> float | None:
        """Count one request of `tokens`; or, over a limit, the seconds to that window's end."""
        checks: tuple[tuple[WindowName, int | None, int | None], ...] = (
            ("minute", limits.rpm, limits.tpm),
            ("day", limits.rpd, limits.tpd),
            ("month", limits.rpmonth, limits.tpmonth),
        )
        used = self._counted.used
        for window, requests, token_limit in checks:
            if (requests is not None and used(scope, "requests", window, wall) + 1 > requests) or (
                token_limit is not None
                and used(scope, "tokens", window, wall) + tokens > token_limit
            ):
                return max(1.0, window_end(window, wall) - wall)
        self._counted.add(scope, wall, requests=1, tokens=tokens)
        if len(self._counted.counts) > 4096:  # old windows are never read again
            self._counted.prune(wall)
        return None


class _Body(httpx2.AsyncByteStream):
    def __init__(self, parts: Sequence[bytes]) -> None:
        self._parts = parts

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for part in self._parts:
            yield part


class ReplayTransport(httpx2.AsyncBaseTransport):
    """Every lane of one replayed config, answered in-process (see the module docstring)."""

    def __init__(
        self,
        lanes: Mapping[str, SimLane],
        asks: Sequence[Ask],
        wall: Callable[[], float],
        faults: Sequence[Fault] = (),
    ) -> None:
        self._lanes = dict(lanes)  # host → lane
        self._asks = asks
        self._wall = wall
        self._quotas = Quotas()
        self._spent: dict[str, float] = {}  # credit lane → USD used
        self._faults: dict[str, list[Fault]] = {}
        for fault in sorted(faults, key=lambda f: f.at):
            self._faults.setdefault(fault.lane, []).append(fault)
        self.requests = 0
        self.refused: dict[str, int] = {}  # lane → requests refused over a quota

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        lane = self._lanes.get(request.url.host)
        if lane is None:
            return _json(404, {"error": {"message": "no such provider in the replay"}})
        path = request.url.path
        if request.method == "GET":
            if path.endswith("/models"):
                return _json(200, {"object": "list", "data": [{"id": m} for m in lane.models]})
            left = (
                None if lane.budget_usd is None else lane.budget_usd - self._spent.get(lane.name, 0)
            )
            return _json(200, {"data": {"limit_remaining": left}})
        self.requests += 1
        body = json.loads(await request.aread())
        model = str(body.get("model") or "")
        text = _text_of(body)
        found = _INDEX.search(text[:64])
        ask = (
            self._asks[int(found.group(1))]
            if found
            else Ask(prompt_tokens=len(text) // 4, completion_tokens=1, latency_s=0.0)
        )
        wall = self._wall()
        if (fault := self._fault(lane, model, wall)) is not None:
            return fault
        embedding = path.endswith("/embeddings")
        cap = completion_cap(body)
        completion = 0 if embedding else min(ask.completion_tokens, cap or ask.completion_tokens)
        if (refusal := self._admit(lane, model, wall, ask.prompt_tokens, completion)) is not None:
            return refusal
        if ask.latency_s > 0:
            await trio.sleep(ask.latency_s)
        usage = {
            "prompt_tokens": ask.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": ask.prompt_tokens + completion,
        }
        if embedding:
            vector = {"object": "embedding", "index": 0, "embedding": [0.0, 1.0]}
            read = {"prompt_tokens": ask.prompt_tokens, "total_tokens": ask.prompt_tokens}
            return _json(200, {"object": "list", "model": model, "data": [vector], "usage": read})
        if body.get("stream"):
            return _stream(model, usage)
        answered = {"role": "assistant", "content": "ok"}
        return _json(
            200,
            {
                "id": "whatif",
                "object": "chat.completion",
                "created": int(wall),
                "model": model,
                "choices": [{"index": 0, "message": answered, "finish_reason": "stop"}],
                "usage": usage,
            },
        )

    def _admit(
        self, lane: SimLane, model: str, wall: float, prompt: int, completion: int
    ) -> httpx2.Response | None:
        """Count a request of these tokens against its quota and charge it to a credit budget; or
        refuse it: 429 over a quota (not counted), 402 past the budget (counted, not charged)."""
        if lane.limited(model):
            wait = self._quotas.admit(lane.scope(model), lane.limits, wall, prompt + completion)
            if wait is not None:
                self.refused[lane.name] = self.refused.get(lane.name, 0) + 1
                return _json(
                    429,
                    {"error": {"message": "rate limit reached", "type": "rate_limit_exceeded"}},
                    {"retry-after": str(int(wait + 0.999))},
                )
        if lane.budget_usd is not None:
            price_in, price_out = lane.prices.get(model, (0.0, 0.0))
            cost = (prompt * price_in + completion * price_out) / 1e6
            if self._spent.get(lane.name, 0.0) + cost > lane.budget_usd:
                return _json(402, {"error": {"message": "insufficient credits"}})
            self._spent[lane.name] = self._spent.get(lane.name, 0.0) + cost
        return None

    def _fault(self, lane: SimLane, model: str, wall: float) -> httpx2.Response | None:
        for fault in self._faults.get(lane.name, ()):
            if fault.at > wall:
                break
            if wall >= fault.until or (fault.kind == "rate_limited" and fault.model != model):
                continue
            if fault.kind == "connect":
                raise httpx2.ConnectError("replayed outage: connection refused")
            if fault.kind == "reset":
                raise httpx2.ReadError("replayed outage: connection reset")
            if fault.kind == "rate_limited":
                left = int(fault.until - wall) + 1
                return _json(
                    429, {"error": {"message": "replayed 429"}}, {"retry-after": str(left)}
                )
            if fault.kind == "credit_exhausted":
                return _json(402, {"error": {"message": "replayed 402"}})
            return _json(503, {"error": {"message": "replayed outage"}})
        return None


def _text_of(body: Mapping[str, Any]) -> str:
    messages = body.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[0], Mapping):
        content = messages[0].get("content")
        return content if isinstance(content, str) else ""
    value = body.get("input")
    return value if isinstance(value, str) else ""


def _json(status: int, payload: Any, headers: Mapping[str, str] | None = None) -> httpx2.Response:
    return httpx2.Response(
        status,
        headers={"content-type": "application/json", **(headers or {})},
        content=json.dumps(payload).encode(),
    )


def _stream(model: str, usage: Mapping[str, int]) -> httpx2.Response:
    def event(*choices: Mapping[str, Any], **extra: Any) -> bytes:
        chunk: dict[str, Any] = {"id": "whatif", "object": "chat.completion.chunk", "model": model}
        chunk |= {"choices": list(choices), **extra}
        return b"data: " + json.dumps(chunk).encode() + b"\n\n"

    parts = [
        event({"index": 0, "delta": {"role": "assistant", "content": "ok"}, "finish_reason": None}),
        event({"index": 0, "delta": {}, "finish_reason": "stop"}),
        event(usage=dict(usage)),
        b"data: [DONE]\n\n",
    ]
    return httpx2.Response(200, headers={"content-type": "text/event-stream"}, stream=_Body(parts))

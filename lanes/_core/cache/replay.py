"""A cache hit read as a stream: the entry's chat completion given back as the chunks a stream of
it would be (`rules.chunks_of`), through the same doors, dialects and recovery as an upstream's
stream — which it never breaks: nothing is sent anywhere."""

from __future__ import annotations

from collections import deque
from typing import Any, Self

from lanes._core.cache.rules import Status, streamed_again, tier_of
from lanes._core.cache.store import Entry
from lanes._core.model.candidates import Attempt, Candidate, Outcome, Route
from lanes._core.upstream.bodies import Received


class CachedStream:
    """An entry as a stream for the request `request_id`, whose deadline is `deadline_at`."""

    def __init__(
        self,
        entry: Entry,
        body: dict[str, Any],
        *,
        request_id: str,
        deadline_at: float,
        usage: bool,
        age_s: float,
    ) -> None:
        """`body` is what the entry keeps, parsed (`Assembler.kept`); `usage`: the request asked for
        the usage chunk."""
        self._entry = entry
        self._request_id, self._deadline_at, self._age_s = request_id, deadline_at, age_s
        self._candidate = Candidate(lane=entry.lane, model=entry.model, tier=tier_of(entry.route))
        chunks = streamed_again(body, f"chatcmpl-{request_id}", usage=usage)
        self._chunks: deque[tuple[dict[str, Any], str]] = deque(chunks)
        completion = body["completion"]
        self._usage = completion.get("usage")
        self._finish = next((c.get("finish_reason") for c in completion["choices"]), None)
        self._texts: list[str] = []
        self._tool_calls = False
        self._delivered = 0
        self._outcome: Outcome | None = None

    @property
    def cache(self) -> Status | None:
        return "hit"

    @property
    def request_id(self) -> str:
        return self._request_id

    @property
    def deadline_at(self) -> float:
        return self._deadline_at

    @property
    def age_s(self) -> float | None:
        return self._age_s

    @property
    def candidate(self) -> Candidate:
        return self._candidate

    @property
    def provider(self) -> str:
        return self._entry.provider

    @property
    def lane(self) -> str:
        return self._entry.lane

    @property
    def model(self) -> str:
        return self._entry.model

    @property
    def attempts(self) -> tuple[Attempt, ...]:
        return ()

    @property
    def attempt_count(self) -> int:
        return 0

    @property
    def cost_usd(self) -> float:
        return 0.0

    @property
    def job_cost_usd(self) -> float:
        return 0.0

    @property
    def saved_usd(self) -> float:
        """What the entry's answer cost when it was made: what this hit saved."""
        return self._entry.cost_usd

    @property
    def delivered_tool_calls(self) -> bool:
        return self._tool_calls

    @property
    def chunks_delivered(self) -> int:
        return self._delivered

    @property
    def route(self) -> Route:
        return "cache"

    @property
    def buffered(self) -> int:
        return len(self._chunks)

    @property
    def usage(self) -> dict[str, Any] | None:
        return dict(self._usage) if isinstance(self._usage, dict) else None

    @property
    def finish_reason(self) -> str | None:
        return self._finish

    @property
    def outcome(self) -> Outcome | None:
        return self._outcome

    @property
    def delivered_text(self) -> str:
        return "".join(self._texts)

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> dict[str, Any]:
        received = await self.next_chunk()
        if received is None:
            raise StopAsyncIteration
        return received[0]

    async def next_chunk(self) -> Received | None:
        if not self._chunks:
            self._outcome = self._outcome or "ok"
            return None
        chunk, data = self._chunks.popleft()
        self._delivered += 1
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {} if isinstance(choice, dict) else {}
            if isinstance(content := delta.get("content"), str):
                self._texts.append(content)
            self._tool_calls = self._tool_calls or bool(delta.get("tool_calls"))
        return chunk, data

    def close(self) -> None:
        if self._outcome is None:
            self._outcome = "abandoned"

    def discard(self, why: str) -> None:
        self.close()

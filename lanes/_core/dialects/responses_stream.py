"""A stream of chat completion chunks → OpenAI's Responses API stream events. Pure.

`ResponseEvents` turns one chunk at a time into `response.created` …
`response.reasoning_text.delta`, `response.output_text.delta`,
`response.function_call_arguments.delta` … `response.completed` — or, when the answer broke,
the in-band `error` event and `response.failed`: the `response` a whole answer gets
(`responses_reply.py`), piece by piece.
"""

from __future__ import annotations

# lanes: pure
from collections.abc import Callable, Mapping
from typing import Any

from lanes._core.dialects import responses_tools
from lanes._core.dialects.call_ids import minted
from lanes._core.dialects.common import ChoiceReader
from lanes._core.dialects.responses_reply import (
    call_item,
    declared,
    finished,
    message_item,
    reasoning_item,
    shell,
    usage_of,
)

# -- a stream --------------------------------------------------------------------------------------


#: The two kinds of content item a stream writes, by the reader's name for their pieces: the id's
#: prefix, how the item is built, and the events of its text (`….delta`, `….done`).
_CONTENT: dict[str, tuple[str, Callable[..., dict[str, Any]], str]] = {
    "thinking": ("rs", reasoning_item, "response.reasoning_text"),
    "text": ("msg", message_item, "response.output_text"),
}


def _logprobs(kind: str) -> dict[str, Any]:
    """What a text event carries beside its text (a message's logprobs; nothing for reasoning)."""
    return {"logprobs": []} if kind == "text" else {}


#: The request's members each `response` of a stream echoes, long in an agent's request (its tools
#: and system prompt): `ResponseEvents(written=...)` has them written once, not once per event.
_ECHOED = ("instructions", "tools")


class ResponseEvents:
    """Chat completion chunks in, Responses stream events out (sans-io: no I/O, no clock).

    `start()` once, `feed(chunk)` for each chunk, then `finish()` — or `fail(...)` when the answer
    broke. Each returns the events to send, in order, numbered by `sequence_number`.
    """

    def __init__(
        self,
        body: Mapping[str, Any],
        *,
        response_id: str,
        created_at: float,
        model: str,
        written: Callable[[Any], Any] | None = None,
    ) -> None:
        self._body = body
        self._written = written  # what stands for each echoed member in the events (see _ECHOED)
        self._echoed: dict[str, Any] | None = None
        self._id = response_id
        self._created_at = created_at
        self._model = model
        self._reader = ChoiceReader()
        self._tools = responses_tools.naming(body.get("tools"))  # as `to_chat` read them
        self._sequence = 0
        self._output: list[dict[str, Any]] = []  # items as they stand, in output order
        self._open: dict[str, dict[str, Any]] = {}  # "thinking" or "text" → its item being written
        self._calls: dict[int, dict[str, Any]] = {}  # chat tool-call index → its open item

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def _response(self, status: str) -> dict[str, Any]:
        response = shell(
            self._body,
            response_id=self._id,
            created_at=self._created_at,
            model=self._reader.model or self._model,
            status=status,
        )
        if self._written is not None:
            if self._echoed is None:  # each written once, for every event that echoes it
                self._echoed = {name: self._written(response[name]) for name in _ECHOED}
            response.update(self._echoed)
        response["output"] = [dict(item) for item in self._output]
        return response

    def start(self) -> list[dict[str, Any]]:
        response = self._response("in_progress")
        return [
            self._event("response.created", response=response),
            self._event("response.in_progress", response=response),
        ]

    def feed(self, chunk: Mapping[str, Any]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for kind, value in self._reader.read(chunk):
            if kind == "tool":
                events += self._call_delta(*value)
            else:
                events += self._content_delta(kind, value)
        return events

    def _content_delta(self, kind: str, delta: str) -> list[dict[str, Any]]:
        """A piece of reasoning or of text: into its open item, opened first (closing the other
        kind's and the calls) when there is none."""
        events: list[dict[str, Any]] = []
        if kind not in self._open:
            other = "text" if kind == "thinking" else "thinking"
            events += self._close(other) + self._close_calls() + self._begin(kind)
        item = self._open[kind]
        item["_text"] += delta
        where = {"item_id": item["id"], "output_index": item["output_index"], "content_index": 0}
        name = f"{_CONTENT[kind][2]}.delta"
        events.append(self._event(name, **where, delta=delta, **_logprobs(kind)))
        return events

    def _begin(self, kind: str) -> list[dict[str, Any]]:
        """Open an item of `kind` (a reasoning item, or a message) and its one content part."""
        prefix, make, _ = _CONTENT[kind]
        index = len(self._output)
        item_id = f"{prefix}_{self._id}" if index == 0 else f"{prefix}_{self._id}_{index}"
        item = self._open[kind] = make(item_id, "", status="in_progress")
        item["output_index"], item["_text"] = index, ""
        self._output.append(item)
        part = make(item_id, "")["content"][0]  # the part as it starts: no text yet
        where = {"item_id": item_id, "output_index": index, "content_index": 0}
        return [
            self._added(item),
            self._event("response.content_part.added", **where, part=part),
        ]

    def _call_delta(
        self,
        index: int,
        call_id: str | None,
        name: str | None,
        arguments: str,
        extra: dict[str, Any] | None,
    ) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        item = self._calls.get(index)
        if item is None:
            events += self._close("thinking") + self._close("text") + self._close_calls()
            position = len(self._output)
            item = call_item(
                f"fc_{self._id}_{position}",
                minted(call_id or f"call_{self._id}_{position}", extra),
                "",
                "",
                status="in_progress",
            )
            if name:
                declared(item, name, self._tools)
            item["output_index"] = position
            self._calls[index] = item
            self._output.append(item)
            events.append(self._added(item))
        elif name and not item["name"]:
            declared(item, name, self._tools)
        if arguments:
            item["arguments"] += arguments
            events.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=item["output_index"],
                    delta=arguments,
                )
            )
        return events

    def _added(self, item: Mapping[str, Any]) -> dict[str, Any]:
        return self._event(
            "response.output_item.added", output_index=item["output_index"], item=_public(item)
        )

    def _done(self, kind: str, status: str) -> tuple[int, dict[str, Any]] | None:
        """Close the open item of `kind` in the output, sending nothing: (its index, the item)."""
        item = self._open.pop(kind, None)
        if item is None:
            return None
        index = item["output_index"]
        done = _CONTENT[kind][1](item["id"], item["_text"], status=status)
        self._output[index] = {**done, "output_index": index}
        return index, done

    def _close(self, kind: str) -> list[dict[str, Any]]:
        """Close the open item of `kind`: its text done, its part done, the item done."""
        finished = self._done(kind, "completed")
        if finished is None:
            return []
        index, done = finished
        part = done["content"][0]
        where = {"item_id": done["id"], "output_index": index, "content_index": 0}
        name = f"{_CONTENT[kind][2]}.done"
        return [
            self._event(name, **where, text=part["text"], **_logprobs(kind)),
            self._event("response.content_part.done", **where, part=part),
            self._event("response.output_item.done", output_index=index, item=done),
        ]

    def _close_calls(self) -> list[dict[str, Any]]:
        events = []
        for item in self._calls.values():
            item["status"] = "completed"
            index = item["output_index"]
            events.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    name=item["name"],
                    arguments=item["arguments"],
                )
            )
            events.append(
                self._event("response.output_item.done", output_index=index, item=_public(item))
            )
        self._calls.clear()
        return events

    def finish(self, *, usage: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """The answer is complete: close what is open, then `response.completed` (or
        `response.incomplete` when the answer was cut at its token cap). An empty answer is an
        empty message, as in a whole response. `usage` counts when no chunk fed in carried one
        (the stream's usage can come in a chunk that is not passed on)."""
        events = self._close("thinking")
        events += self._begin("text") if all(i["type"] == "reasoning" for i in self._output) else []
        events += self._close("text") + self._close_calls()
        response = finished(self._response("completed"), self._reader.finish_reason)
        response["usage"] = usage_of(self._reader.usage or usage)
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        return [*events, self._event(kind, response=_public_response(response))]

    def fail(self, code: str, message: str, *, status: int = 502) -> list[dict[str, Any]]:
        """The answer broke and could not be recovered: the in-band `error` event (`code`: the
        provider's own when it said why), then `response.failed` with what had been delivered
        (open items marked incomplete) and its error — a rate limit when `status` is 429."""
        error = self._event("error", code=code, message=message, param=None)
        self._done("thinking", "incomplete")
        self._done("text", "incomplete")
        for item in self._calls.values():
            item["status"] = "incomplete"
        self._calls.clear()
        response = self._response("failed")
        kind = "rate_limit_exceeded" if status == 429 else "server_error"
        response["error"] = {"code": kind, "message": message}
        response["usage"] = usage_of(self._reader.usage)
        return [error, self._event("response.failed", response=_public_response(response))]


def _public(item: Mapping[str, Any]) -> dict[str, Any]:
    """An output item without the translation's own bookkeeping keys."""
    return {k: v for k, v in item.items() if k not in ("output_index", "_text")}


def _public_response(response: dict[str, Any]) -> dict[str, Any]:
    response["output"] = [_public(item) for item in response["output"]]
    return response

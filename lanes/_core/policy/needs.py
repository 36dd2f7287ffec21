"""What a job needs of a model, read from the job alone: capabilities (tools, images, JSON mode),
its estimated input tokens and the output cap it asked for. Pure."""

from __future__ import annotations

# lanes: pure
import json
from collections.abc import Mapping
from typing import Any

import attrs

from lanes._core.model.candidates import Candidate
from lanes._core.model.job import Job
from lanes._core.policy.room import output_room


@attrs.frozen(kw_only=True)
class Needs:
    """What a request requires of a model."""

    tools: bool = False
    images: bool = False
    json_mode: bool = False
    tokens: int = 0  # estimated input tokens plus requested output
    embedding: bool = False  # an embedding model is needed (and only one)
    input_tokens: int = 0  # estimated input tokens (`estimate_tokens`)
    output_tokens: int = 0  # the output cap the client asked for (0: none)


def input_bytes(job: Job) -> int:
    """Bytes of the messages and tools (or an embedding's input) as JSON."""
    return job.input_bytes()


def estimate_tokens(job: Job) -> int:
    """A typical estimate of input tokens: 1 per 4 bytes of the messages and tools."""
    return input_bytes(job) // 4 + 1


def max_output_tokens(params: Mapping[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = params.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def needs_of(job: Job) -> Needs:
    if job.embedding:  # each input must fit the model's context on its own
        inputs = job.input if isinstance(job.input, list | tuple) else [job.input]
        if all(isinstance(v, int) for v in inputs):
            inputs = [inputs]
        longest = max(len(json.dumps(v, ensure_ascii=False).encode()) for v in inputs)
        return Needs(embedding=True, tokens=longest // 4 + 1)
    images = any(
        isinstance(part, Mapping) and part.get("type") in ("image_url", "input_image")
        for message in job.messages
        if isinstance(message.get("content"), list)
        for part in message["content"]
    )
    response_format = job.params.get("response_format")
    json_mode = isinstance(response_format, Mapping) and response_format.get("type") in (
        "json_object",
        "json_schema",
    )
    estimate = estimate_tokens(job)
    asked = max_output_tokens(job.params) or 0
    return Needs(
        tools=bool(job.params.get("tools")),
        images=images,
        json_mode=json_mode,
        tokens=estimate + asked,
        input_tokens=estimate,
        output_tokens=asked,
    )


def clamped(candidate: Candidate, needs: Needs) -> bool:
    """Would an attempt on `candidate` be sent a lower output cap than the client asked for?"""
    room = output_room(candidate, needs.input_tokens)
    return bool(needs.output_tokens) and room is not None and room < needs.output_tokens

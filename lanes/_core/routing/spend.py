"""What a paid attempt may cost: the request as it is sent, and its true worst case. Pure.

The reservation under the daily ceiling must be at least what any upstream that honours the sent
caps could bill, so both are computed from the request *as sent*:

- **Output** is bounded by one cap, sent in the parameter the lane's dialect honours
  (`max_tokens`, or `max_completion_tokens` for OpenAI's newer models — the lane module declares
  it): the smaller of what the client asked for and `paid_max_tokens`. The other cap parameter is
  not sent, so no larger value the upstream might read gets through.
- **Input** is bounded by bytes: no tokenizer makes more tokens than the UTF-8 bytes it reads, and
  the whole body counts — messages, tools, legacy `functions`, `response_format` schemas, and
  everything else the upstream may read.
- **Images** cost the model's `image_usd` each (beside their bytes); audio, video and files have no
  bounded price here, nor do images on a model without `image_usd`: such a request is refused for
  paid, never guessed.
- **`n`** choices multiply all of it (a provider may bill the prompt once per choice).
- **An embedding** has no output: its worst case is its whole body at the input price.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import attrs

from lanes._core.job import Candidate, Job
from lanes.freetier.prices import cost_usd

# lanes: pure

CAP_PARAMS = ("max_tokens", "max_completion_tokens")
MAX_CHOICES = (
    128  # `n` above this is refused for paid: no provider serves it, and it bounds the bill
)
_MEDIA = {"input_audio", "audio", "audio_url", "video_url", "input_video", "file", "input_file"}
_IMAGES = {"image_url", "input_image", "image"}


@attrs.frozen
class Unbounded:
    """Why a request's worst case can not be bounded for a candidate (so it is not sent there)."""

    reason: str

    def __str__(self) -> str:
        return self.reason


def requested_cap(params: Mapping[str, Any]) -> int | None:
    """The smallest positive whole-number output cap the client gave, in either parameter."""
    caps = [cap for key in CAP_PARAMS if (cap := _count(params.get(key))) is not None and cap > 0]
    return min(caps) if caps else None


def paid_request(job: Job, *, cap_param: str, paid_max_tokens: int) -> Job:
    """`job` as a paid attempt sends it: one output cap, in `cap_param`, never above
    `paid_max_tokens` nor above what the client asked for."""
    asked = requested_cap(job.params)
    cap = paid_max_tokens if asked is None else min(asked, paid_max_tokens)
    params = {k: v for k, v in job.params.items() if k not in CAP_PARAMS}
    params[cap_param] = cap
    return attrs.evolve(job, params=params)


def worst_case(candidate: Candidate, job: Job) -> float | Unbounded:
    """The most `job`, sent as it is to `candidate`, can be billed (USD), or why that is unknown."""
    body = job.body(candidate.model)
    if job.embedding and candidate.input_usd_per_mtok is not None:
        return cost_usd(billed_bytes(body), 0, candidate.input_usd_per_mtok, 0.0)
    if candidate.input_usd_per_mtok is None or candidate.output_usd_per_mtok is None:
        return Unbounded(f"{candidate.key} has no known price")
    cap = _count(body.get(candidate.cap_param))
    if cap is None or cap <= 0:
        return Unbounded(f"no output cap in {candidate.cap_param}")
    raw_n = body.get("n", 1)
    n = _count(raw_n)
    if n is None or not 1 <= n <= MAX_CHOICES:
        return Unbounded(f"n must be a whole number from 1 to {MAX_CHOICES} (got {raw_n!r})")
    kinds = list(_part_types(body.get("messages")))
    media = sorted({k for k in kinds if k in _MEDIA})
    if media:
        return Unbounded(f"{', '.join(media)} input has no bounded price")
    images = sum(1 for k in kinds if k in _IMAGES)
    if images and candidate.image_usd is None:
        return Unbounded(f"{images} image(s) and no image_usd for {candidate.key}")
    per_choice = cost_usd(
        billed_bytes(body), cap, candidate.input_usd_per_mtok, candidate.output_usd_per_mtok
    )
    return n * (per_choice + images * (candidate.image_usd or 0.0))


def billed_bytes(body: Mapping[str, Any]) -> int:
    """UTF-8 bytes of everything in `body` an upstream may read as input (all of it but the
    stream switches): an upper bound on its input tokens."""
    readable = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    raw = json.dumps(readable, ensure_ascii=False, default=str, separators=(",", ":"))
    return len(raw.encode("utf-8", "surrogatepass"))


def _part_types(messages: Any) -> Iterator[str]:
    """The `type` of every content part in `messages` (images, audio, …), however nested."""
    stack = [messages]
    while stack:
        value = stack.pop()
        if isinstance(value, Mapping):
            kind = value.get("type")
            if isinstance(kind, str):
                yield kind
            stack.extend(value.values())
        elif isinstance(value, list | tuple):
            stack.extend(value)


def _count(value: Any) -> int | None:
    """A whole number (not a bool), or None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None

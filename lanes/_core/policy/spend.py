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
  paid, never guessed. Messages are an allowlist too: a message field other than
  `_MESSAGE_FIELDS` (e.g. a reference to an earlier audio answer) or a content part other than
  text or an image (a document the provider fetches), or a part's `cache_control`, is unbounded.
- **Tools** may cost more than their bytes: a provider that wraps them in a tool-use prompt of
  its own bills that prompt too. The lane module declares its size (`tool_prompt_tokens`); a lane
  that declares none is assumed to add `UNDECLARED_TOOL_PROMPT_TOKENS`, twice the largest such
  prompt any provider documents.
- **`n`** choices multiply all of it (a provider may bill the prompt once per choice).
- **Nothing else is billed**: a request that carries a parameter the reservation does not price
  — one not in `PRICED_PARAMS` (an allowlist, so a billing switch a provider invents tomorrow is
  refused, not billed unpriced), a value of one that bills more (`service_tier: "priority"`,
  audio `modalities`), or a billing switch the lane module declares — can not be bounded.
- **An embedding** has no output: its worst case is its whole body at the input price.

Attempts that are not paid carry no reservation, so a lane's declared billing switches are taken
out of them instead (`as_sent`): a free model of a mixed provider never buys a paid one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import attrs

from lanes._core.freetier.prices import cost_usd
from lanes._core.model.candidates import Candidate
from lanes._core.model.job import Job
from lanes._core.policy.needs import estimate_tokens
from lanes._core.policy.room import output_room

# lanes: pure

CAP_PARAMS = ("max_tokens", "max_completion_tokens")
# `n` above this is refused for paid: no provider serves it, and it bounds the bill
MAX_CHOICES = 128
_MEDIA = {"input_audio", "audio", "audio_url", "video_url", "input_video", "file", "input_file"}
_IMAGES = {"image_url", "input_image", "image"}
_TEXT_PARTS = frozenset({"text", "input_text", "output_text", "refusal"})
#: The message fields priced by their bytes; any other (an audio answer's id, …) may bill more.
_MESSAGE_FIELDS = frozenset(
    {"role", "content", "name", "tool_calls", "tool_call_id", "function_call", "refusal"}
)
#: The content-part fields priced by their bytes (not `cache_control`: a cache write bills more).
_PART_FIELDS = frozenset({"type", "text", "refusal", "image_url", "input_image", "image", "detail"})
#: Twice the largest tool-use prompt a provider documents adding itself (530 tokens): what a lane
#: that declares no `tool_prompt_tokens` is assumed to add to a request with tools.
UNDECLARED_TOOL_PROMPT_TOKENS = 1024


def _anything(value: Any) -> bool:
    return True


def _client_tools(value: Any) -> bool:
    """No hosted tool: tools the client runs itself (functions) are priced by their bytes, but a
    hosted one (a search, a code interpreter — it declares its own `type`) is billed per use by
    the provider, which no reservation prices. Anything else is bytes an upstream refuses."""
    tools = value if isinstance(value, list) else [value]
    return not any(
        isinstance(tool, Mapping) and tool.get("type", "function") not in ("function", "custom")
        for tool in tools
    )


#: The chat parameters a worst case covers, each with the values it covers: what they cost is
#: priced (caps, `n`, the bytes of tools, functions and schemas) or they leave the bill as it is
#: (sampling, stop, tool choice, who asks, stream settings, the reasoning spent within the cap).
#: Anything else — `service_tier: "priority"`, `web_search_options`, audio output, `prediction`, a
#: parameter invented tomorrow — is not sent on an attempt that is held to its worst case.
PRICED_PARAMS: Mapping[str, Callable[[Any], bool]] = {
    **dict.fromkeys(
        (
            *CAP_PARAMS,
            "n",
            "stream_options",
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "stop",
            "seed",
            "presence_penalty",
            "frequency_penalty",
            "repetition_penalty",
            "logit_bias",
            "logprobs",
            "top_logprobs",
            "tool_choice",
            "parallel_tool_calls",
            "functions",
            "function_call",
            "response_format",
            "user",
            "safety_identifier",
            "prompt_cache_key",
            "metadata",
            "store",  # OpenAI keeps the completion for evals: not billed
            "reasoning_effort",
            "verbosity",
        ),
        _anything,
    ),
    "tools": _client_tools,
    "modalities": lambda value: value == ["text"],  # audio output has no bounded price
    "service_tier": lambda value: value in ("auto", "default"),  # priority bills above the list
}
#: Checked parameters whose refused value may be shown (the others may hold a prompt).
_SHOWN = frozenset({"modalities", "service_tier"})
#: The embedding parameters a worst case covers (its whole body is priced as input).
PRICED_EMBEDDING_PARAMS = frozenset({"dimensions", "encoding_format", "user", "input_type"})
_NOT_PARAMS = frozenset({"model", "messages", "input", "stream"})


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


def as_sent(job: Job, candidate: Candidate, *, paid_max_tokens: int, capped: bool) -> Job:
    """`job` as an attempt on `candidate` sends it. Held to its worst case (`capped`: paid, or
    spending credits), it carries one output cap (`paid_request`); not paid, it carries none of
    the billing switches the lane declares — there is no reservation to cover them. A reasoning
    effort a translated request asked for goes only to a model that declares `reasoning`, as
    chat's `reasoning_effort` (priced: reasoning tokens are output tokens, within the cap)."""
    if candidate.tier not in ("paid", "byok") and candidate.billing_switches & set(job.params):
        params = {k: v for k, v in job.params.items() if k not in candidate.billing_switches}
        job = attrs.evolve(job, params=params)
    if job.reasoning_effort is not None and candidate.reasoning:
        job = attrs.evolve(job, params={"reasoning_effort": job.reasoning_effort, **job.params})
    job = within_room(job, candidate)
    if capped and not job.embedding:
        job = paid_request(job, cap_param=candidate.cap_param, paid_max_tokens=paid_max_tokens)
    return job


def within_room(job: Job, candidate: Candidate) -> Job:
    """`job` with its output caps no larger than what `candidate` can write after the input
    (`output_room`): a client's cap is a ceiling, and lowering it only lowers a worst case."""
    asked = requested_cap(job.params)
    if asked is None or job.embedding:
        return job
    room = output_room(candidate, estimate_tokens(job))
    if room is None or room >= asked:
        return job
    room = max(room, 1)  # the plan keeps only models with room; a recovery's longer input too
    params = {
        k: (min(v, room) if k in CAP_PARAMS and _count(v) is not None else v)
        for k, v in job.params.items()
    }
    return attrs.evolve(job, params=params)


def unpriced(candidate: Candidate, body: Mapping[str, Any], *, embedding: bool) -> str | None:
    """Why a parameter of `body` (as sent to `candidate`) may bill beyond its worst case, or
    None. Only the value of a short parameter checked by value is named (others may hold a
    prompt)."""
    for key, value in body.items():
        if key in _NOT_PARAMS:
            continue
        if key in candidate.billing_switches:
            return f"lane {candidate.lane} declares {key!r} a billing switch no reservation prices"
        if embedding:
            if key not in PRICED_EMBEDDING_PARAMS:
                return f"parameter {key!r} is not one the reservation prices"
            continue
        covers = PRICED_PARAMS.get(key)
        if covers is None:
            return f"parameter {key!r} is not one the reservation prices"
        if not covers(value) and key not in _SHOWN:
            return f"parameter {key!r} holds a value the reservation does not price"
        if not covers(value):
            shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:37]}..."
            return f"{key}={shown} may bill beyond what the reservation prices"
    return None


def worst_case(candidate: Candidate, job: Job) -> float | Unbounded:
    """The most `job`, sent as it is to `candidate`, can be billed (USD), or why that is unknown."""
    body = job.body(candidate.model)
    reason = unpriced(candidate, body, embedding=job.embedding)
    if reason is not None:
        return Unbounded(reason)
    if job.embedding and candidate.input_usd_per_mtok is not None:
        return cost_usd(billed_bytes(body), 0, candidate.input_usd_per_mtok, 0.0)
    if candidate.input_usd_per_mtok is None or candidate.output_usd_per_mtok is None:
        return Unbounded(f"{candidate.key} has no known price")
    cap = _count(body.get(candidate.cap_param))
    if cap is None or cap <= 0:
        return Unbounded(f"no output cap in {candidate.cap_param}")
    raw_n = body.get("n")
    n = 1 if raw_n is None else _count(raw_n)  # null is the provider's default: one choice
    if n is None or not 1 <= n <= MAX_CHOICES:
        return Unbounded(f"n must be a whole number from 1 to {MAX_CHOICES} (got {raw_n!r})")
    kinds = list(_part_types(body.get("messages")))
    media = sorted({k for k in kinds if k in _MEDIA})
    if media:
        return Unbounded(f"{', '.join(media)} input has no bounded price")
    if (unknown := _unpriced_content(body.get("messages"))) is not None:
        return Unbounded(f"{unknown} has no bounded price")
    images = sum(1 for k in kinds if k in _IMAGES)
    if images and candidate.image_usd is None:
        return Unbounded(f"{images} image(s) and no image_usd for {candidate.key}")
    per_choice = cost_usd(
        billed_bytes(body) + tool_prompt_tokens(candidate, body),
        cap,
        candidate.input_usd_per_mtok,
        candidate.output_usd_per_mtok,
    )
    return n * (per_choice + images * (candidate.image_usd or 0.0))


def tool_prompt_tokens(candidate: Candidate, body: Mapping[str, Any]) -> int:
    """The input a provider adds itself to a request with tools (its tool-use prompt), in tokens:
    what the lane declares, else `UNDECLARED_TOOL_PROMPT_TOKENS`; none without tools."""
    if not (body.get("tools") or body.get("functions")):
        return 0
    declared = candidate.tool_prompt_tokens
    return UNDECLARED_TOOL_PROMPT_TOKENS if declared is None else declared


def billed_bytes(body: Mapping[str, Any]) -> int:
    """UTF-8 bytes of everything in `body` an upstream may read as input (all of it but the
    stream switches): an upper bound on its input tokens."""
    readable = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    raw = json.dumps(readable, ensure_ascii=False, default=str, separators=(",", ":"))
    return len(raw.encode("utf-8", "surrogatepass"))


def _unpriced_content(messages: Any) -> str | None:
    """The first message field or content part the worst case can not price, named (its name
    only, cut short: never the content), or None."""
    for message in messages if isinstance(messages, list) else ():
        if not isinstance(message, Mapping):
            continue
        if extra := sorted(str(k) for k in message if k not in _MESSAGE_FIELDS):
            return f"the message field {extra[0][:40]!r}"
        content = message.get("content")
        for part in content if isinstance(content, list) else ():
            kind = part.get("type") if isinstance(part, Mapping) else None
            if not isinstance(kind, str) or (kind not in _TEXT_PARTS and kind not in _IMAGES):
                return f"a content part of type {str(kind)[:40]!r}"
            if extra := sorted(str(k) for k in part if k not in _PART_FIELDS):
                return f"the content part field {extra[0][:40]!r}"
    return None


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

"""Why no candidate could ever serve a job — whatever the moment: the catalog can not. Pure.

A job every candidate is unfit for (`policy.unfit`) is not load: it is a 400 naming the need no
candidate meets and, for a context, the numbers. The verdict speaks of the candidates that came
closest — those meeting the most of the needs, in `policy.STAGES` order.
"""

from __future__ import annotations

# lanes: pure
from collections.abc import Sequence

from lanes._core.model.candidates import Candidate
from lanes._core.model.job import Job
from lanes._core.model.record import Verdict
from lanes._core.policy.needs import Needs
from lanes._core.policy.policy import STAGES, unmet


def never_served(
    job: Job, candidates: Sequence[Candidate], needs: Needs, privacy: str
) -> Verdict | None:
    """Why none of `candidates` could ever serve `job` — whatever the moment: the catalog can not
    — or None when one could (or there is none to judge). It speaks of the candidates that came
    closest: those that met the most of the needs, in `unfit`'s order."""
    found = [unmet(c, needs, privacy) for c in candidates]
    if not candidates or any(f is None for f in found):
        return None
    stage = max(f[0] for f in found if f is not None)
    closest = [c for c, f in zip(candidates, found, strict=True) if f is not None and f[0] == stage]
    what = STAGES[stage]
    if what == "context":
        return _too_long(job, closest, needs)
    if what == "output":
        largest = max(
            min(c.max_output_tokens or c.context or 0, c.context or c.max_output_tokens or 0)
            for c in closest
        )
        return Verdict(
            code="context_length_exceeded",
            message=f"needs {needs.output_tokens} output tokens; the largest output any candidate "
            f"allows is {largest} tokens",
            param=_cap_param(job),
        )
    if what == "privacy":
        where = "local" if privacy == "local" else "local or zero-data-retention"
        return Verdict(
            code="no_capable_model",
            message=f"no candidate meets X-Lanes-Privacy: {privacy} (none of "
            f"{len(candidates)} is {where}); send the job with another privacy or add such a lane",
        )
    if what == "kind":
        return Verdict(
            code="no_capable_model", message=wrong_kind(job.model, needs.embedding), param="model"
        )
    ability, param = {
        "tools": ("calls tools", "tools"),
        "images": ("takes images", "messages"),
        "json_mode": ("has a JSON mode", "response_format"),
    }[what]
    return Verdict(
        code="no_capable_model",
        message=f"no candidate for model {job.model!r} {ability} (of "
        f"{', '.join(c.key for c in closest[:5])}{', …' if len(closest) > 5 else ''})",
        param=param,
    )


def wrong_kind(model: str, embedding: bool) -> str:
    """What to say of a `model` whose models are all of the other kind than the job needs."""
    if embedding:
        return f"model {model!r} is not an embedding model: it serves chat completions only"
    return f"model {model!r} is an embedding model: it serves /v1/embeddings only"


def _cap_param(job: Job) -> str | None:
    """The field the job's output cap came in."""
    return next((k for k in ("max_completion_tokens", "max_tokens") if k in job.params), None)


def _too_long(job: Job, closest: Sequence[Candidate], needs: Needs) -> Verdict:
    """The verdict for a request longer than the largest context of the candidates closest."""
    largest = max(c.context or 0 for c in closest)
    output = needs.output_tokens
    if output and needs.input_tokens < largest:  # the output asked for is too long
        message = (
            f"needs {output} output tokens (on ~{needs.input_tokens} of input); the largest "
            f"context any candidate allows is {largest} tokens"
        )
        return Verdict(code="context_length_exceeded", message=message, param=_cap_param(job))
    message = (  # the Messages API's words, which Claude Code reads as its cue to compact
        f"prompt is too long: it needs ~{needs.tokens} tokens (~{needs.input_tokens} of input); "
        f"the largest context any candidate allows is {largest} tokens"
    )
    return Verdict(code="context_length_exceeded", message=message, param="messages")

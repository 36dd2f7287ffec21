"""How much output a model can be asked for. Pure.

A client's output cap (`max_tokens`) is a ceiling, not a demand: Claude Code asks for 64,000
whatever it expects. A model whose context (after the input) or declared `max_output_tokens`
holds less is still fit when it holds at least `MIN_CLAMPED_OUTPUT` of it (all of it, when less
was asked), and is sent the cap it holds (`output_room`; `spend.within_room`) — an answer longer
than that ends as cut (`length`), as it would at the client's own cap. On a paid attempt the
lowered cap only lowers the worst case, which is priced from the request as sent.
"""

from __future__ import annotations

# lanes: pure
from lanes._core.model.candidates import Candidate

#: The least of a client's output cap a model must hold to be sent the job with its cap lowered
#: to what it holds (tokens); a model that holds less of it is not fit.
MIN_CLAMPED_OUTPUT = 4096


def output_room(candidate: Candidate, input_tokens: int) -> int | None:
    """The most output tokens an attempt on `candidate` can ask for with `input_tokens` of input:
    what its context leaves and its declared `max_output_tokens`, the smaller; None when neither
    is known."""
    known = [
        room
        for room in (
            None if candidate.context is None else candidate.context - input_tokens,
            candidate.max_output_tokens,
        )
        if room is not None
    ]
    return min(known) if known else None

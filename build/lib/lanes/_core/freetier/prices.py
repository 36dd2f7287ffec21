"""What an answer cost: the one price formula, and the usage it may be computed from. Pure.

Prices are USD per million tokens. Usage comes from outside (an upstream's `usage` object), so it
is believed only when it is sane and adds up:

- prompt and completion tokens are non-negative whole numbers, each at most `MAX_TOKENS`;
- `total_tokens`, when sent (and not null), is one too, and is not short of prompt + completion by
  more than rounding (`ROUNDING_TOKENS`, or `ROUNDING_SHARE` of the parts if more). A total *above*
  its parts is honest: some providers count reasoning, tool-use prompt or cache tokens in the total
  only (an OpenAI-compatible Gemini answer: `prompt 4, completion 10, total 407`; OpenAI's own
  `reasoning_tokens` are inside `completion_tokens`, and its total is their sum). That excess is
  billed too, at the dearer of the two prices, since the usage does not say which it is.
- `completion_tokens_details.reasoning_tokens`, when sent, is a count that one of those holds:
  inside the completion (OpenAI, DeepSeek) or inside the total's excess (xAI, Gemini). Reasoning
  neither holds (`completion 10, total 20, reasoning 5000`) may be billed beside them: no proof.

Anything else — negative, fractional, strings, huge, only `total_tokens`, or a total of `2**64`,
`1e300` or below its parts — is not usage, and the caller settles at its worst case (the
reservation) instead. An embedding's usage (prompt tokens and an equal total, no completion count)
counts as zero completion tokens. Prices and balances from outside are bounded the same way
(`price`, `usd_amount`): nothing unbounded reaches arithmetic or a store.
"""

from __future__ import annotations

# lanes: pure
from collections.abc import Mapping
from typing import Any

#: No single answer is billed for more tokens than this; a larger figure is garbage, not usage.
MAX_TOKENS = 100_000_000
#: How far a `total_tokens` may fall short of prompt + completion and still add up: this many
#: tokens, or this share of the parts when that is more.
ROUNDING_TOKENS = 1
ROUNDING_SHARE = 0.001
#: No model costs more than this per million tokens; a larger price is garbage, not a price.
MAX_USD_PER_MTOK = 10_000.0
#: No balance or credit figure is larger than this (USD) in either direction.
MAX_USD = 1_000_000_000.0


def cost_usd(
    input_tokens: int, output_tokens: int, input_usd_per_mtok: float, output_usd_per_mtok: float
) -> float:
    """USD for `input_tokens` in and `output_tokens` out at the given prices per million tokens."""
    return (input_tokens * input_usd_per_mtok + output_tokens * output_usd_per_mtok) / 1e6


def usd_text(amount: float) -> str:
    """A USD figure as it travels in a header or a stream's trailer: its shortest decimal that
    reads back as the same float (`repr`, exponent and all: `2.12e-05`), `0` for nothing. Never
    rounded, so a priced answer never shows as free and the figures sum to the ledger's total."""
    return "0" if amount == 0 else repr(float(amount))


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOKENS:
        return None
    return value


def price(value: Any, *, scale: float = 1.0) -> float | None:
    """A price in USD per million tokens (`value` × `scale`) from outside — a catalog, a config —
    or None when it is not a finite number in 0..`MAX_USD_PER_MTOK`."""
    usd = bounded(value, 0.0, MAX_USD_PER_MTOK)
    return None if usd is None else bounded(usd * scale, 0.0, MAX_USD_PER_MTOK)


def bounded(value: Any, low: float, high: float) -> float | None:
    """A number from outside (int, float or numeric string) as a float in `low`..`high`, or None:
    NaN, infinities, huge integers, booleans and anything else are not numbers here."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        number = float(value)
    except (ValueError, OverflowError):
        return None
    return number if low <= number <= high else None  # NaN fails both comparisons


def usd_amount(value: Any) -> float | None:
    """A USD figure from outside (a balance, a credit) within ±`MAX_USD`, or None."""
    return bounded(value, -MAX_USD, MAX_USD)


def usage_total(usage: Any) -> int | None:
    """Tokens an answer used, for counting against quotas: what its usage adds up to when it is
    sane, else the largest sane count it gives (the parts' sum, or the total), else None."""
    tokens = usage_tokens(usage)
    if tokens is not None:
        return tokens[0] + tokens[1]
    if not isinstance(usage, Mapping):
        return None
    prompt, completion = _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
    parts = prompt + completion if prompt is not None and completion is not None else None
    counts = [n for n in (parts, _count(usage.get("total_tokens"))) if n is not None]
    return max(counts) if counts else None


def usage_tokens(usage: Any) -> tuple[int, int] | None:
    """(prompt tokens, completion tokens) from an OpenAI `usage` object, or None when it is not
    sane or does not add up (the module says when). A total above the parts counts its excess as
    completion."""
    read = _read_usage(usage)
    return None if read is None else (read[0], read[1] + read[2])


#: The last usage read, and what it read as: an answer's usage is read by the quota, the
#: attempt, the tally and the audit in turn (the same object, never changed once parsed).
_last_read: tuple[Any, tuple[int, int, int] | None] = (None, None)


def _read_usage(usage: Any) -> tuple[int, int, int] | None:
    """(prompt, completion, excess of the total over them), or None: not sane, or not adding
    up."""
    global _last_read
    last, read = _last_read
    if usage is last and usage is not None:
        return read
    read = _read_usage_of(usage)
    _last_read = (usage, read)
    return read


def _read_usage_of(usage: Any) -> tuple[int, int, int] | None:
    if not isinstance(usage, Mapping):
        return None
    prompt, completion = _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
    sent_total = usage.get("total_tokens")
    if prompt is not None and "completion_tokens" not in usage and sent_total == prompt:
        completion = 0  # an embedding's usage: prompt tokens only, and a total that says so
    if prompt is None or completion is None:
        return None
    if sent_total is None:
        excess = 0
    else:
        total = _count(sent_total)
        parts = prompt + completion
        if total is None or total < parts - max(ROUNDING_TOKENS, parts * ROUNDING_SHARE):
            return None  # a total that is no count, or short of its parts: the parts are no proof
        excess = max(0, total - parts)
    reasoning = _reasoning(usage)
    if reasoning is None or reasoning > completion + excess:
        return None  # reasoning that is no count, or that neither its completion nor total holds
    return prompt, completion, excess


def _reasoning(usage: Mapping[str, Any]) -> int | None:
    """The reasoning tokens `usage` reports (`completion_tokens_details.reasoning_tokens`), 0
    when it reports none, None when what it reports is no count."""
    details = usage.get("completion_tokens_details")
    value = details.get("reasoning_tokens") if isinstance(details, Mapping) else None
    return 0 if value is None else _count(value)


def usage_cost(
    usage: Any, input_usd_per_mtok: float | None, output_usd_per_mtok: float | None
) -> float | None:
    """What `usage` cost at these prices; None when the usage is not sane or does not add up (or
    a price it needs is unknown: an embedding, with no output, needs only the input price). The
    total's excess over its parts is billed at the dearer price."""
    read = _read_usage(usage)
    if read is None or input_usd_per_mtok is None:
        return None
    prompt, completion, excess = read
    if output_usd_per_mtok is None and (completion or excess):
        return None
    output = output_usd_per_mtok or 0.0
    return cost_usd(prompt, completion, input_usd_per_mtok, output) + cost_usd(
        excess, 0, max(input_usd_per_mtok, output), 0.0
    )


def settled_usd(
    usage: Any,
    input_usd_per_mtok: float | None,
    output_usd_per_mtok: float | None,
    *,
    reserved_usd: float,
) -> tuple[float, bool]:
    """(USD, believed): what an answered attempt held to its worst case (`reserved_usd`) settles
    at — the cost its usage reports when that usage is sane and adds up (believed), else the
    reservation, which is the most an upstream honouring the request's caps could bill."""
    cost = usage_cost(usage, input_usd_per_mtok, output_usd_per_mtok)
    return (reserved_usd, False) if cost is None else (cost, True)

"""What an answer cost: the one price formula, and the usage it may be computed from. Pure.

Prices are USD per million tokens. Usage comes from outside (an upstream's `usage` object), so it
is believed only when it is sane: non-negative whole numbers of prompt and completion tokens, each
at most `MAX_TOKENS`. Anything else — negative, fractional, strings, huge, or only `total_tokens` —
is not usage, and the caller settles at its worst case instead. An embedding's usage (prompt tokens
and an equal total, no completion count) counts as zero completion tokens. Prices and balances
from outside are bounded the same way (`price`, `usd_amount`): nothing unbounded reaches
arithmetic or a store.
"""

from __future__ import annotations

# lanes: pure
from collections.abc import Mapping
from typing import Any

#: No single answer is billed for more tokens than this; a larger figure is garbage, not usage.
MAX_TOKENS = 100_000_000
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
    """Tokens an answer used, from an OpenAI `usage` object: prompt + completion when both are
    sane, else a sane `total_tokens`, else None."""
    tokens = usage_tokens(usage)
    if tokens is not None:
        return tokens[0] + tokens[1]
    return _count(usage.get("total_tokens")) if isinstance(usage, Mapping) else None


def usage_tokens(usage: Any) -> tuple[int, int] | None:
    """(prompt tokens, completion tokens) from an OpenAI `usage` object, or None when it is not
    sane. A `total_tokens` above the two parts counts its excess as completion: some providers
    bill reasoning, audio or cache tokens outside `completion_tokens` and only the total says
    so."""
    if not isinstance(usage, Mapping):
        return None
    prompt, completion = _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
    if (
        prompt is not None
        and "completion_tokens" not in usage
        and usage.get("total_tokens") == prompt
    ):
        completion = 0  # an embedding's usage: prompt tokens only, and a total that says so
    if prompt is None or completion is None:
        return None
    total = _count(usage.get("total_tokens"))
    if total is not None and total > prompt + completion:
        completion = total - prompt
    return prompt, completion


def usage_cost(
    usage: Any, input_usd_per_mtok: float | None, output_usd_per_mtok: float | None
) -> float | None:
    """What `usage` cost at these prices; None when the usage is not sane (or a price it needs is
    unknown: an embedding, with no output, needs only the input price)."""
    tokens = usage_tokens(usage)
    if tokens is None or input_usd_per_mtok is None:
        return None
    if output_usd_per_mtok is None and tokens[1]:
        return None
    return cost_usd(tokens[0], tokens[1], input_usd_per_mtok, output_usd_per_mtok or 0.0)

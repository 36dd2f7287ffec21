"""The five kinds of free tier (and `none`), as a tagged union read from TOML by `kind = "..."`.

Pure. Each lane module declares its provider's default kind; config overrides it per lane:

```toml
[lanes.free_tier]
kind = "rate_limited"
rpm = 30
rpd = 14400
```
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from typing import Literal

import attrs

from lanes._core.model.validators import at_least


def _as_patterns(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


_limit = attrs.field(
    default=None, validator=at_least(0, hint="; delete the key to stop tracking it")
)


@attrs.frozen(kw_only=True)
class AlwaysFreeLocal:
    """Owned capacity (Ollama, LM Studio, llama.cpp): no limits, nothing to track."""

    kind: Literal["local"] = "local"


@attrs.frozen(kw_only=True)
class Subscription:
    """Included in a subscription the user already pays for; effectively unlimited."""

    kind: Literal["subscription"] = "subscription"


@attrs.frozen(kw_only=True)
class RateLimitedFree:
    """Free within request and token limits per window; 0 or absent means not tracked."""

    kind: Literal["rate_limited"] = "rate_limited"
    rpm: int | None = _limit
    rpd: int | None = _limit
    rpmonth: int | None = _limit
    tpm: int | None = _limit
    tpd: int | None = _limit
    tpmonth: int | None = _limit
    account_wide: bool = False  # a 429 parks every model of the provider, not just one


@attrs.frozen(kw_only=True)
class CustomEndpoint:
    """Where to read the remaining balance: `json_path` is dotted, e.g. `data.limit_remaining`."""

    url: str
    method: Literal["GET", "POST"] = "GET"
    headers: dict[str, str] = attrs.field(factory=dict)
    json_path: str = "data.limit_remaining"


@attrs.frozen(kw_only=True)
class CreditBased:
    """Dollar credits, optionally reset each period; detection says how the balance is known."""

    kind: Literal["credits"] = "credits"
    budget_usd: float = attrs.field(default=0.0, validator=at_least(0))
    reset: Literal["daily", "monthly", "never"] = "never"
    detection: Literal["local", "provider_api", "custom"] = "local"
    endpoint: CustomEndpoint | None = None
    rpm: int | None = _limit
    rpd: int | None = _limit


@attrs.frozen(kw_only=True)
class FreeModelsOnly:
    """Some models are free (matched by glob patterns such as `*:free`), the rest are paid."""

    kind: Literal["free_models"] = "free_models"
    patterns: tuple[str, ...] = attrs.field(default=("*:free",), converter=_as_patterns)
    rpm: int | None = _limit
    rpd: int | None = _limit
    account_wide: bool = True

    def covers(self, model: str) -> bool:
        return any(fnmatch.fnmatchcase(model, pattern) for pattern in self.patterns)


@attrs.frozen(kw_only=True)
class NoFreeTier:
    """No free tier at all (OpenAI, Anthropic): every model is paid."""

    kind: Literal["none"] = "none"


FreeTierKind = (
    AlwaysFreeLocal | Subscription | RateLimitedFree | CreditBased | FreeModelsOnly | NoFreeTier
)

KINDS: dict[str, type] = {
    "local": AlwaysFreeLocal,
    "subscription": Subscription,
    "rate_limited": RateLimitedFree,
    "credits": CreditBased,
    "free_models": FreeModelsOnly,
    "none": NoFreeTier,
}


def tier_of(
    kind: FreeTierKind, model: str, declared_free: bool | None
) -> Literal["local", "free", "paid"]:
    """The tier of one (lane, model): owned, borrowed-free or paid. Unknown price is not free.

    `declared_free` is the model's `free` flag from config or the catalog (None when not said). It
    is honoured for every kind: `free = false` makes any model paid (it needs consent and the
    ceiling), `free = true` makes a model of a `none` or `free_models` lane borrowed-free.
    """
    if declared_free is False:
        return "paid"
    if isinstance(kind, AlwaysFreeLocal):
        return "local"
    if declared_free is True:
        return "free"
    if isinstance(kind, NoFreeTier):
        return "paid"
    if isinstance(kind, FreeModelsOnly):
        return "free" if kind.covers(model) else "paid"
    return "free"

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
    #: requests per minute (0 or absent: not tracked)
    rpm: int | None = _limit
    #: requests per day (0 or absent: not tracked)
    rpd: int | None = _limit
    #: requests per month (0 or absent: not tracked)
    rpmonth: int | None = _limit
    #: tokens per minute (0 or absent: not tracked)
    tpm: int | None = _limit
    #: tokens per day (0 or absent: not tracked)
    tpd: int | None = _limit
    #: tokens per month (0 or absent: not tracked)
    tpmonth: int | None = _limit
    #: the limits are the account's: a 429 parks every model of the provider, not just one
    account_wide: bool = False


@attrs.frozen(kw_only=True)
class CustomEndpoint:
    """Where to read the remaining balance: `json_path` is dotted, e.g. `data.limit_remaining`."""

    #: where to ask the remaining balance (`{base_url}` stands for the lane's)
    url: str
    #: the HTTP method of that request
    method: Literal["GET", "POST"] = "GET"
    #: headers sent with it, beside the lane's own (its key among them)
    headers: dict[str, str] = attrs.field(factory=dict)
    #: the dotted path of the remaining balance, in USD, in the JSON answer
    json_path: str = "data.limit_remaining"


@attrs.frozen(kw_only=True)
class CreditBased:
    """Dollar credits, optionally reset each period; detection says how the balance is known."""

    kind: Literal["credits"] = "credits"
    #: the credits, in USD
    budget_usd: float = attrs.field(default=0.0, validator=at_least(0))
    #: when the credits come back
    reset: Literal["daily", "monthly", "never"] = "never"
    #: how the balance is known: counted here (`local`), asked from the provider's own balance
    #: endpoint (`provider_api`), or from `endpoint` (`custom`), every `balance_poll_s`
    detection: Literal["local", "provider_api", "custom"] = "local"
    #: `custom` detection: where the balance is read (the table below)
    endpoint: CustomEndpoint | None = None
    #: requests per minute (0 or absent: not tracked)
    rpm: int | None = _limit
    #: requests per day (0 or absent: not tracked)
    rpd: int | None = _limit


@attrs.frozen(kw_only=True)
class FreeModelsOnly:
    """Some models are free (matched by glob patterns such as `*:free`), the rest are paid."""

    kind: Literal["free_models"] = "free_models"
    #: globs naming the free models (case-sensitive); every other model is paid
    patterns: tuple[str, ...] = attrs.field(default=("*:free",), converter=_as_patterns)
    #: requests per minute (0 or absent: not tracked)
    rpm: int | None = _limit
    #: requests per day (0 or absent: not tracked)
    rpd: int | None = _limit
    #: the limits are the account's: a 429 parks every free model of the provider, not just one
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

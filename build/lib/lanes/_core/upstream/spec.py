"""What a lane module declares (`Provider`), and a lane's settings resolved once (`LaneSpec`). Pure.

A lane's settings come from two places: the lane module's `Provider` (the provider's defaults) and
the operator's `[[lanes]]` table (`LaneConfig`). The settings are declared once, by `Provider`; a
`LaneSpec` is a `Provider` resolved with the operator's table, and `LaneConfig` may override every
field it shares with `Provider` (`OVERRIDDEN`, found from the two classes). `resolve(provider,
config)` resolves them in one place, by one rule, and everything that needs a lane's URL, key
variable, kind, models, headers or money parameters reads the `LaneSpec` it returns:

- the operator's value when the table gives one, else the lane module's (`base_url` without a
  trailing `/`; `tool_prompt_tokens` None: undeclared, `spend.UNDECLARED_TOOL_PROMPT_TOKENS` is
  assumed);
- `headers`: both, the operator's value winning for a header both name;
- `billing_switches`: both (the operator adds parameters; it can not take the module's away).

A spec's `name` is the lane's (`provider` the provider's). What only the operator sets (timeouts,
breaker, limits, `byok`, `discover`) is read from `config`, the table as written.
"""

from __future__ import annotations

# lanes: pure
from collections.abc import Iterable, Mapping

import attrs

from lanes._core.config.schema import LaneConfig, ModelConfig
from lanes._core.freetier.kinds import CustomEndpoint, FreeTierKind
from lanes._core.policy.spend import CAP_PARAMS


def _names(value: Iterable[str]) -> frozenset[str]:
    return frozenset(value)


@attrs.frozen(kw_only=True)
class Provider:
    """A provider's defaults, as a lane module declares them; `resolve` merges them with each
    lane's config."""

    name: str
    base_url: str
    api_key_env: str = ""  # "" = no key needed
    free_tier: FreeTierKind
    models: tuple[ModelConfig, ...] = ()
    headers: Mapping[str, str] = attrs.field(factory=dict)
    prefill: bool = False  # accepts a trailing assistant message and continues it
    # unsuffixed header windows, e.g. requests → 86400
    conventions: Mapping[str, float] = attrs.field(factory=dict)
    # where `detection = "provider_api"` reads the balance ({base_url} allowed)
    balance: CustomEndpoint | None = None
    # The output cap the provider honours: `max_tokens`, or `max_completion_tokens` (OpenAI's
    # newer models accept only that one). A paid attempt sends its cap there, and only there.
    output_cap: str = attrs.field(default="max_tokens", validator=attrs.validators.in_(CAP_PARAMS))
    # Request parameters that make the provider bill beyond the request itself — another model to
    # fall back to, a plugin or a search billed per use. They are taken out of every attempt that is
    # not paid (a free or credit attempt has no reservation to cover them), and a paid attempt that
    # carries one is refused. Parameters the reservation does not price are refused for paid anyway.
    billing_switches: frozenset[str] = attrs.field(default=frozenset(), converter=_names)
    # Input tokens the provider adds itself to a request with tools (a tool-use system prompt),
    # added to a paid or credit attempt's worst case. None: not declared — the engine assumes the
    # most any provider documents (`spend.UNDECLARED_TOOL_PROMPT_TOKENS`).
    tool_prompt_tokens: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.ge(0))
    )
    catalog_path: str = "/models"  # GET {base_url}{catalog_path} lists the models
    # its shape: openai, per_token_prices, per_mtok_prices, prefixed_ids
    catalog_style: str = "openai"


#: The settings a `[[lanes]]` table may override: those it shares with `Provider` (its `name` is
#: the lane's, not the provider's).
OVERRIDDEN = tuple(
    f.name
    for f in attrs.fields(Provider)
    if f.name != "name" and f.name in attrs.fields_dict(LaneConfig)
)
#: Of those, the ones both sides add to rather than replace.
_MERGED = ("headers", "billing_switches")


@attrs.frozen(kw_only=True)
class LaneSpec(Provider):
    """One lane's settings, resolved once by `resolve`: the lane module's declaration with the
    operator's table over it. Read-only; a lane keeps it as `lane.spec`."""

    name: str  # the lane's name, as config gives it
    provider: str  # the provider's name, as the lane module declares it
    config: LaneConfig  # the operator's table, as written: the knobs only it sets are read here


def resolve(provider: Provider, config: LaneConfig) -> LaneSpec:
    """The settings of the lane `config` describes over `provider`, each resolved by its rule (the
    module docstring lists them). Pure; raises nothing the two validated records can hold."""
    fields = attrs.asdict(provider, recurse=False)
    fields |= {
        name: value
        for name in OVERRIDDEN
        if name not in _MERGED and (value := getattr(config, name)) is not None
    }
    return LaneSpec(
        **fields
        | {
            "base_url": fields["base_url"].rstrip("/"),
            "models": tuple(fields["models"]),
            "headers": {**provider.headers, **config.headers},
            "billing_switches": provider.billing_switches | frozenset(config.billing_switches),
            "name": config.name,
        },
        provider=provider.name,
        config=config,
    )

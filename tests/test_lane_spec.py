"""A lane's settings are settled once (`resolve`), by one rule per field."""

from __future__ import annotations

from typing import Any

import attrs
import hypothesis.strategies as st
from hypothesis import given

from lanes._core.config.schema import LaneConfig, ModelConfig
from lanes._core.policy.spend import CAP_PARAMS
from lanes._core.upstream.spec import LaneSpec, Provider, resolve
from lanes.freetier.kinds import AlwaysFreeLocal, NoFreeTier, RateLimitedFree

#: How each setting both the lane module and the operator may give is settled (spec.py's docstring).
#: `override`: the operator's when given, else the module's, else the default; `per_header`: both,
#: the operator's winning for a header both name; `union`: both; `operator`: the operator's.
RULES = {
    "name": "operator",
    "base_url": "override",
    "api_key_env": "override",
    "free_tier": "override",
    "models": "override",
    "output_cap": "override",
    "tool_prompt_tokens": "override",
    "headers": "per_header",
    "billing_switches": "union",
}


def names(cls: type) -> set[str]:
    return {f.name for f in attrs.fields(cls)}


SHARED = names(Provider) & names(LaneConfig)


def test_every_shared_setting_is_settled_in_the_spec():
    """Every field both `Provider` and `LaneConfig` declare is a `LaneSpec` field with a rule, so
    a field added to both and forgotten in the spec (or in resolve's rules) fails here."""
    assert {"base_url", "api_key_env", "free_tier", "models", "headers"} <= SHARED
    assert names(LaneSpec) >= SHARED
    assert set(RULES) == SHARED


def test_what_only_the_module_declares_is_carried_as_declared():
    """Every other `Provider` field is a `LaneSpec` field too, holding the module's value."""
    provider = Provider(
        name="p",
        base_url="https://p.example/v1",
        free_tier=NoFreeTier(),
        prefill=True,
        conventions={"requests": 86_400.0},
        catalog_path="/v1/models",
        catalog_style="prefixed_ids",
    )
    spec = resolve(provider, LaneConfig(name="lane"))
    only = names(Provider) - SHARED
    assert only <= names(LaneSpec)
    assert {n: getattr(spec, n) for n in only} == {n: getattr(provider, n) for n in only}
    assert (spec.provider, spec.declared) == ("p", provider)


URLS = st.sampled_from(["https://a.example/v1", "https://b.example/v1/", "http://127.0.0.1:8/v1"])
KINDS = st.sampled_from([NoFreeTier(), AlwaysFreeLocal(), RateLimitedFree(rpm=3)])
MODELS = st.lists(st.builds(ModelConfig, id=st.sampled_from(["m1", "m2", "m3"])), max_size=3)
HEADERS = st.dictionaries(st.sampled_from(["X-A", "X-B", "X-C"]), st.sampled_from(["1", "2"]))
SWITCHES = st.lists(st.sampled_from(["models", "route", "plugins"]), max_size=3)
#: Values each side may give, by field (the operator's are what its TOML structures into).
VALUES: dict[str, st.SearchStrategy[Any]] = {
    "base_url": URLS,
    "api_key_env": st.sampled_from(["", "A_KEY", "B_KEY"]),
    "free_tier": KINDS,
    "models": MODELS,
    "output_cap": st.sampled_from(sorted(CAP_PARAMS)),
    "tool_prompt_tokens": st.integers(0, 5_000),
    "headers": HEADERS,
    "billing_switches": SWITCHES,
}
REQUIRED = {"name", "base_url", "free_tier"}  # a Provider must give these


@st.composite
def sides(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    """What a lane module gives and what an operator gives: each field, or nothing."""
    module: dict[str, Any] = {"name": "prov"}
    operator: dict[str, Any] = {"name": "lane"}
    for field, values in VALUES.items():
        if field in REQUIRED or draw(st.booleans()):
            module[field] = draw(values)
        if draw(st.booleans()):
            operator[field] = draw(values)
    module["models"] = tuple(module.get("models", ()))
    return module, operator


def settled(field: str, value: Any) -> Any:
    """A value as the spec holds it."""
    if field == "base_url":
        return value.rstrip("/")
    if field == "models":
        return tuple(value)
    if field == "billing_switches":
        return frozenset(value)
    return value


def default(field: str) -> Any:
    """The value a `Provider` that does not give `field` holds."""
    return getattr(Provider(name="p", base_url="https://p.example", free_tier=NoFreeTier()), field)


@given(sides())
def test_resolve_settles_each_field_by_its_rule(given_sides):
    """The operator's value when given, else the module's, else the default (headers and billing
    switches: both, the operator's header winning)."""
    module, operator = given_sides
    spec = resolve(Provider(**module), LaneConfig(**operator))
    for field, rule in RULES.items():
        got = getattr(spec, field)
        if rule == "operator":
            assert got == operator[field], field
        elif rule == "override":
            source = operator if field in operator else module
            want = settled(field, source[field]) if field in source else default(field)
            assert got == want, field
        elif rule == "per_header":
            mine, theirs = operator.get(field, {}), module.get(field, {})
            assert got == {k: mine.get(k, theirs.get(k)) for k in {*mine, *theirs}}, field
        else:
            assert got == settled(field, [*module.get(field, ()), *operator.get(field, ())]), field

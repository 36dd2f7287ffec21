"""A lane's settings are settled once (`resolve`), by one rule per field; and a lane module written
with only the names `lanes` exports can subclass the shared lane, rewrite its requests and load."""

from __future__ import annotations

import ast
import sys
import textwrap
from typing import Any, cast

import attrs
import hypothesis.strategies as st
from hypothesis import given

import lanes
from helpers import config
from lanes._core.config.schema import LaneConfig, ModelConfig
from lanes._core.freetier.kinds import AlwaysFreeLocal, NoFreeTier, RateLimitedFree
from lanes._core.policy.spend import CAP_PARAMS
from lanes._core.upstream.loader import find_module
from lanes._core.upstream.spec import OVERRIDDEN, LaneSpec, Provider, resolve
from lanes.testing import open_fake

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
    """A spec is a settled `Provider`, and every field both `Provider` and `LaneConfig` declare is
    one the operator overrides by a rule (found from the classes, not listed), so a field added to
    both and missing a rule here fails."""
    assert {"base_url", "api_key_env", "free_tier", "models", "headers"} <= SHARED
    assert issubclass(LaneSpec, Provider) and names(LaneSpec) >= SHARED
    assert set(RULES) == SHARED == {*OVERRIDDEN, "name"}


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
    assert (spec.name, spec.provider) == ("lane", "p")


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


#: A lane module written as a lane author would: `import lanes` and the standard library only.
AUTHORED = '''
"""Acme: a local server that wants `safe_mode` in every request."""

from typing import Any

import lanes

PROVIDER = lanes.Provider(
    name="acme",
    base_url="http://127.0.0.1:1/v1",
    free_tier=lanes.AlwaysFreeLocal(),
    models=(lanes.Model(id="acme-small"),),
)


class Lane(lanes.OpenAICompatibleLane):
    def __init__(
        self, spec: lanes.LaneSpec, *, api_key: lanes.Secret | None, upstream: lanes.Upstream
    ) -> None:
        super().__init__(spec, api_key=api_key, upstream=upstream)
        self.greeting = f"hello from {spec.provider} at {spec.base_url}"

    def adapt_request(self, body: dict[str, Any], job: lanes.Job) -> dict[str, Any]:
        body.setdefault("safe_mode", False)
        return body
'''


def imported(source: str) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            found.add(node.module or "")
    return found


async def test_a_lane_module_of_public_names_subclasses_and_loads(
    env, tmp_path, monkeypatch, autojump_clock
):
    """A module importing only `lanes` subclasses the shared lane, is loaded, and its hook
    rewrites what is sent."""
    assert imported(AUTHORED) == {"typing", "lanes"}
    pkg = tmp_path / "authored"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "acme.py").write_text(textwrap.dedent(AUTHORED))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        async with open_fake("local", models=("acme-small",)) as fake:
            cfg = config({"name": "acme", "module": "authored.acme", "base_url": fake.base_url})
            async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
                reply = await dispatcher.complete(
                    lanes.Job(messages=[{"role": "user", "content": "hi"}])
                )
                lane = dispatcher.lanes["acme"]
            [sent] = fake.requests("acme-small")
    finally:
        sys.modules.pop("authored.acme", None)
        sys.modules.pop("authored", None)
    assert reply.lane == "acme"
    assert type(lane).__module__ == "authored.acme"
    assert vars(lane)["greeting"] == f"hello from acme at {fake.base_url}"
    assert sent.body["safe_mode"] is False


async def test_a_lane_class_that_fails_to_build_is_one_line(
    env, caplog_lanes, tmp_path, monkeypatch, autojump_clock
):
    """A `Lane` whose constructor raises (written against another signature) leaves its lane out
    with one line naming the module; the rest start."""
    pkg = tmp_path / "stale"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "old.py").write_text(
        textwrap.dedent("""
        import lanes
        PROVIDER = lanes.Provider(
            name="old", base_url="http://127.0.0.1:1/v1", free_tier=lanes.AlwaysFreeLocal(),
            models=(lanes.Model(id="m"),),
        )
        class Lane(lanes.OpenAICompatibleLane):
            def __init__(self, *, provider, config, api_key, upstream):
                raise AssertionError("not reached")
        """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        async with lanes.open_dispatcher(
            config({"name": "old", "module": "stale.old"}, {"name": "ollama"}), env=env
        ) as dispatcher:
            assert list(dispatcher.lanes) == ["ollama"]
            unavailable = dispatcher.statistics().unavailable
    finally:
        sys.modules.pop("stale.old", None)
        sys.modules.pop("stale", None)
    why = "module stale.old: its Lane failed to build (TypeError) — skipped"
    assert unavailable == {"old": why}
    assert f"lane old: {why}" in caplog_lanes.messages


def openrouter(**table: Any) -> lanes.OpenAICompatibleLane:
    """The shipped OpenRouter lane, built as the loader builds it (no request is sent)."""
    lane_config = LaneConfig(name="openrouter", **table)
    module, why = find_module(lane_config)
    assert module is not None, why
    spec = resolve(module.PROVIDER, lane_config)
    return cast(
        lanes.OpenAICompatibleLane,
        module.Lane(spec, api_key=None, upstream=cast(lanes.Upstream, None)),
    )


def test_openrouter_asks_for_zero_retention_through_the_hook():
    """OpenRouter's quirk goes through `adapt_request`: a zdr job's body asks its router for zero
    retention and no fallbacks, streamed or not; any other job's body is the job's own."""
    lane = openrouter()
    messages = [{"role": "user", "content": "hi"}]
    zdr = lanes.Job(messages=messages, privacy="zdr", params={"provider": {"order": ["a"]}})
    for stream in (False, True):
        body = lane.request_body(zdr, "m:free", stream=stream)
        assert body["provider"] == {
            "order": ["a"],
            "data_collection": "deny",
            "zdr": True,
            "allow_fallbacks": False,
        }
    plain = lanes.Job(messages=messages)
    assert lane.request_body(plain, "m:free", stream=False) == plain.body("m:free")


def test_groq_is_sent_no_gemini_thought_signature():
    """A conversation Gemini served carries its thought signatures on tool calls; Groq refuses a
    property it does not know, so they are taken out of what Groq is sent — and only they: the
    job's own messages are not changed."""
    lane_config = LaneConfig(name="groq")
    module, why = find_module(lane_config)
    assert module is not None, why
    lane = module.Lane(
        resolve(module.PROVIDER, lane_config), api_key=None, upstream=cast(lanes.Upstream, None)
    )
    call = {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}
    signed = {**call, "extra_content": {"google": {"thought_signature": "c2ln"}}}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "read a.txt"},
        {"role": "assistant", "tool_calls": [signed]},
        {"role": "tool", "tool_call_id": "c1", "content": "hello"},
    ]
    job = lanes.Job(messages=messages)
    for stream in (False, True):
        sent = lane.request_body(job, "llama-3.3-70b-versatile", stream=stream)
        assert sent["messages"][1]["tool_calls"] == [call]
        assert sent["messages"][0] == messages[0] and sent["messages"][2] == messages[2]
    assert job.messages[1]["tool_calls"] == [signed]


def test_the_lane_reads_its_settings_from_the_spec():
    """The lane's URL, kind, configured models, headers and money parameters are the spec's."""
    lane = openrouter(
        base_url="https://proxy.example/or/",
        headers={"X-Title": "mine"},
        billing_switches=["transforms"],
        tool_prompt_tokens=7,
        output_cap="max_completion_tokens",
        models=[ModelConfig(id="only:free")],
    )
    assert lane.spec.base_url == "https://proxy.example/or"
    assert [c.model for c in lane.candidates] == ["only:free"]
    assert lane.headers(stream=False)["X-Title"] == "mine"
    [candidate] = lane.candidates
    module, _ = find_module(LaneConfig(name="openrouter"))
    assert module is not None
    declared = module.PROVIDER.billing_switches
    assert declared and candidate.billing_switches == {"transforms", *declared}
    assert (candidate.tool_prompt_tokens, candidate.cap_param) == (7, "max_completion_tokens")

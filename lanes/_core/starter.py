"""`lanes init`: a starter config for the lanes this machine can use.

Owned local servers (no key needed) come first, then every shipped lane whose key variable is set
in the environment — borrowed-free lanes before credit lanes before paid ones, as routing wants
them. Only variable *names* are written: a key's value never leaves the environment.
"""

from __future__ import annotations

from collections.abc import Mapping

from lanes._core.config.schema import LaneConfig
from lanes._core.upstream.loader import find_provider, shipped_lane_modules
from lanes._core.upstream.spec import LaneSpec, resolve

_ORDER = {"local": 0, "subscription": 1, "rate_limited": 1, "free_models": 1, "credits": 2}
_WHAT = {0: "owned local capacity", 1: "borrowed free capacity", 2: "credits", 3: "paid"}

HEADER = """\
# lanes — a starter config written by `lanes init`. Lanes are tried in the order written:
# owned local capacity first, borrowed free capacity next, the paid fallback last.
# Keys never go here: each lane reads its key from the environment variable named beside it.
# Check it with `lanes check-config {path}`; every key is in the configuration reference:
# {reference}

state = "~/.local/state/lanes/lanes.db"   # usage, spend, backoffs: shared by this host

[policy]
free_tier_fallback = "off"        # off | ask | allow — paid fallback only with consent
paid_ceiling_usd_per_day = 1.0    # the hard paid budget per UTC day
"""


def _shipped() -> list[tuple[int, str, LaneSpec]]:
    """Every shipped lane that speaks HTTP, with its routing order (local, free, credits, paid)."""
    found = []
    for name in shipped_lane_modules():
        config = LaneConfig(name=name)
        provider, _ = find_provider(config)
        if provider is None:
            continue
        spec = resolve(provider, config)
        if not spec.base_url.startswith("http"):
            continue
        kind = spec.free_tier.kind
        if not spec.api_key_env and kind != "local":
            continue  # a remote endpoint without a key variable needs a base_url of your own
        found.append((_ORDER.get(kind, 3), name, spec))
    return sorted(found, key=lambda item: item[0])


def _usable(env: Mapping[str, str]) -> list[tuple[int, str, LaneSpec]]:
    """The shipped lanes this machine can use: local ones, and those whose key is set."""
    return [f for f in _shipped() if not f[2].api_key_env or env.get(f[2].api_key_env)]


def addable(env: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """The free (and credit) lanes a key would add: (lane, the variable to set, what it is), in
    routing order — only names, never a value."""
    return [
        (name, spec.api_key_env, _WHAT[order])
        for order, name, spec in _shipped()
        if order in (1, 2) and spec.api_key_env and not env.get(spec.api_key_env)
    ]


def starter_config(
    env: Mapping[str, str], *, path: str = "lanes.toml", reference: str = "docs/reference/config.md"
) -> tuple[str, list[str]]:
    """The starter config's text, and the lanes it names. `reference`: where the configuration
    reference is (the installed package's documentation page)."""
    lines = [HEADER.format(path=path, reference=reference)]
    names, group = [], None
    for order, name, spec in _usable(env):
        if order != group:
            lines.append(f"\n# {_WHAT[order]}")
            group = order
        lines.append("[[lanes]]")
        note = (
            f"key from ${spec.api_key_env}"
            if spec.api_key_env
            else f"a server on this machine ({spec.base_url})"
        )
        lines.append(f'name = "{name}"'.ljust(30) + f"# {note}")
        if order == 0:
            lines.append("discover = true               # take the models the server lists")
            lines.append("attempt_timeout_s = 60        # a local model may be slow to load")
        lines.append("")
        names.append(name)
    if more := addable(env):
        lines.append("\n# More free lanes: set the variable, then run `lanes init --force` again")
        lines += [f"#   {name:<12} ${var:<22} {what}" for name, var, what in more]
    return "\n".join(lines).rstrip() + "\n", names

"""The canary's prompt set and settings, from `lanes/config/canary.toml` (`canary/prompts.toml`
in the repository; cattrs, unknown keys refused)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from lanes._core.config.schema import read_toml, structure
from lanes._core.config.strict import strict_converter
from lanes._core.model.errors import ConfigError


@attrs.frozen(kw_only=True)
class Checks:
    """Checks that need no judge model. Every one set must pass."""

    # the normalised answer must equal this (case, spaces, trailing dot ignored)
    expect: str | None = None
    contains: list[str] = attrs.field(factory=list)  # each must appear (normalised)
    # the answer parses as a JSON object with these keys
    json_keys: list[str] = attrs.field(factory=list)
    tool_call: str | None = None  # a well-formed call of this function (JSON arguments)
    no_refusal: bool = True  # no "I can't / I cannot / as an AI" refusal
    min_len: int = 0
    max_len: int = 100_000


@attrs.frozen(kw_only=True)
class Prompt:
    id: str
    messages: list[dict[str, Any]]
    max_tokens: int = 64
    seed: int | None = 7
    tools: list[dict[str, Any]] | None = None
    checks: Checks = attrs.field(factory=Checks)


@attrs.frozen(kw_only=True)
class Settings:
    concurrency: int = 4
    deadline_s: float = 30.0
    min_quota_left: int = 5  # skip a model whose reported remaining requests are below this
    # normalised similarity to the baseline at or above this is unchanged
    similarity_ok: float = 0.85
    drift_threshold: float = 0.3  # a model's drift score at or above this is `drifted`
    # drifted / failed models are skipped by routing until they pass or are re-pinned
    quarantine: bool = True


@attrs.frozen(kw_only=True)
class CanaryConfig:
    settings: Settings = attrs.field(factory=Settings)
    prompts: list[Prompt] = attrs.field(factory=list)


_converter = strict_converter()


def read_canary(path: str | Path) -> CanaryConfig:
    """Read the prompt set. Raises `ConfigError` naming the file and the key."""
    raw = read_toml(path)
    try:
        return structure(raw, CanaryConfig, converter=_converter, what="canary config")
    except ConfigError as exc:
        raise ConfigError(f"{Path(path)}: {exc}") from exc

"""Claude-style model names by pattern: next month's name finds its tier's alias, in the shipped
config and under --simulate; an exact alias or model id still wins; a pattern naming no alias is
a config error naming the key."""

from __future__ import annotations

import pytest

import lanes
from helpers import config, free_lane
from lanes._core.check import check_config
from lanes._core.config.schema import packaged, read_config
from lanes._core.engine.catalog import Catalog
from lanes._core.freetier.manager import FreeTierManager

NAMES = {
    "claude-opus-4-8": "claude-opus-4-7",
    "claude-sonnet-5": "claude-sonnet-4-6",
    "claude-haiku-4-5-20251001": "claude-haiku-4-5",
    "claude-3-5-haiku-latest": "claude-haiku-4-5",
    "claude-3-7-sonnet-20250219": "claude-sonnet-4-6",
    "claude-3-opus-latest": "claude-opus-4-7",
    "claude-opus-4-1-20250805": "claude-opus-4-7",
    "claude-2.1": "claude-sonnet-4-6",
}


def routing(cfg: lanes.Config) -> Catalog:
    """The config's names resolved over no lanes (aliases and their patterns only)."""
    return Catalog(
        (),
        aliases=cfg.aliases,
        alias_patterns=cfg.alias_patterns,
        register=FreeTierManager().register,
    )


@pytest.mark.parametrize(("name", "alias"), NAMES.items())
def test_the_shipped_config_resolves_claude_names_by_pattern(name, alias):
    """Each Claude-style name, new or dated, finds its tier's alias in the shipped config."""
    assert routing(read_config(packaged("lanes.toml"), env={})).alias_of(name) == alias


def test_other_names_are_still_unknown():
    """A name no alias, model or pattern matches stays unknown (a 404 over HTTP)."""
    shipped = routing(read_config(packaged("lanes.toml"), env={}))
    assert shipped.alias_of("gpt-4o") is None and shipped.alias_of("Claude-Opus") is None


async def test_under_simulate_claude_names_reach_their_tiers_candidates():
    """Under --simulate the captured names resolve to their alias's own candidates."""
    async with lanes.open_dispatcher(simulate=True) as dispatcher:
        for name, alias in NAMES.items():
            keys = [
                c.key
                for c in dispatcher.resolve(
                    lanes.Job(messages=[{"role": "user", "content": "x"}], model=name)
                )
            ]
            assert keys == dispatcher.config.aliases[alias], name


async def test_an_exact_model_id_wins_over_a_pattern(env):
    """With the lane loaded, the exact model id serves the name, not the pattern's alias."""
    cfg = config(
        free_lane("claude", "http://127.0.0.1:1/v1", models=["claude-sonnet-5", "other"]),
        aliases={"claude-sonnet-4-6": ["claude/other"]},
        alias_patterns={"claude-*sonnet*": "claude-sonnet-4-6"},
    )
    async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
        message = [{"role": "user", "content": "x"}]
        exact = dispatcher.resolve(lanes.Job(messages=message, model="claude-sonnet-5"))
        other = dispatcher.resolve(lanes.Job(messages=message, model="claude-sonnet-6"))
    assert [c.key for c in exact] == ["claude/claude-sonnet-5"]
    assert [c.key for c in other] == ["claude/other"]


def test_a_pattern_naming_no_alias_is_refused_by_key():
    """check-config names the pattern whose alias does not exist, and the nearest alias."""
    cfg = config(
        free_lane("f", "http://127.0.0.1:1/v1"),
        aliases={"claude-haiku-4-5": ["f/free-model"]},
        alias_patterns={"claude-*haiku*": "claude-haiku-4.5"},
    )
    with pytest.raises(lanes.ConfigError) as caught:
        check_config(cfg, env={})
    assert 'alias_patterns["claude-*haiku*"]' in str(caught.value)
    assert 'did you mean "claude-haiku-4-5"' in str(caught.value)

"""Config loading: every shipped file is valid; every mistake names its key and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lanes import ConfigError, load_config, read_config
from lanes.freetier.kinds import CreditBased, FreeModelsOnly, RateLimitedFree

ROOT = Path(__file__).resolve().parent.parent


def error_of(source: dict[str, Any], env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(source, env=env or {})
    return str(caught.value)


@pytest.mark.parametrize("path", sorted((ROOT / "config").glob("*.toml")), ids=lambda p: p.name)
def test_shipped_configs_are_valid(path):
    """Every TOML file under config/ loads (the canary's prompt set by its own schema)."""
    if path.name.startswith("canary"):
        from lanes.canary.prompts import read_canary

        assert len(read_canary(path).prompts) >= 10
    else:
        read_config(path, env={})


def test_bad_url_names_the_key():
    """A malformed base URL names lanes[i].base_url, shows the value and the expected shape."""
    message = error_of(
        {"lanes": [{"name": "a"}, {"name": "b"}, {"name": "c", "base_url": "htp:/x"}]}
    )
    assert 'lanes[2].base_url: not a URL ("htp:/x"); expected https://host/path' in message


def test_unknown_keys_are_refused():
    """A misspelt key is refused with its path."""
    message = error_of({"lanes": [{"name": "groq", "bsae_url": "https://x"}]})
    assert "lanes[0]: unknown key(s) (bsae_url)" in message


def test_wrong_types_name_the_key():
    """A string where a number belongs names the key and the expected type."""
    message = error_of({"lanes": [{"name": "g", "models": [{"id": "m", "context": "big"}]}]})
    assert "lanes[0].models[0].context" in message and "int" in message


def test_negative_limits_say_how_to_stop_tracking():
    """A negative quota names the key, the value and the fix."""
    message = error_of({"lanes": [{"name": "g", "free_tier": {"kind": "rate_limited", "rpm": -5}}]})
    assert (
        "lanes[0].free_tier.rpm: must be >= 0 (got -5); delete the key to stop tracking it"
        in message
    )


def test_unknown_free_tier_kind():
    """An unknown kind lists the kinds there are."""
    message = error_of({"lanes": [{"name": "g", "free_tier": {"kind": "gratis"}}]})
    assert '"gratis" is not a kind' in message and "rate_limited" in message


def test_duplicate_lane_names():
    """Two lanes with one name are refused."""
    assert 'lanes[1].name: "g" is used twice' in error_of({"lanes": [{"name": "g"}, {"name": "g"}]})


def test_every_problem_is_reported_at_once():
    """Mistakes in several lanes are listed together, one per line; top-level keys too."""
    message = error_of(
        {"lanes": [{"name": "x", "idle_s": 0}, {"name": "y", "base_url": "ftp://h"}]}
    )
    assert "lanes[0].idle_s: must be > 0 (got 0" in message
    assert "lanes[1].base_url: not a URL" in message
    assert "default_deadline_s: must be > 0 (got -1)" in error_of({"default_deadline_s": -1})


def test_env_interpolation():
    """${NAME} is replaced from the environment; a missing one names the key and the variable."""
    config = load_config(
        {"lanes": [{"name": "l", "base_url": "${LOCAL_URL}/v1"}]},
        env={"LOCAL_URL": "http://127.0.0.1:9"},
    )
    assert config.lanes[0].base_url == "http://127.0.0.1:9/v1"
    message = error_of({"lanes": [{"name": "l", "base_url": "${NOPE}"}]})
    assert "lanes[0].base_url: environment variable NOPE is not set" in message


def test_free_tier_kinds_structure():
    """Each kind comes back as its own class with its fields."""
    config = load_config(
        {
            "lanes": [
                {"name": "a", "free_tier": {"kind": "rate_limited", "rpm": 30, "rpd": 14400}},
                {
                    "name": "b",
                    "free_tier": {"kind": "credits", "budget_usd": 5, "reset": "monthly"},
                },
                {"name": "c", "free_tier": {"kind": "free_models", "patterns": ["*:free"]}},
            ]
        },
        env={},
    )
    a, b, c = (lane.free_tier for lane in config.lanes)
    assert a == RateLimitedFree(rpm=30, rpd=14400)
    assert isinstance(b, CreditBased) and b.reset == "monthly"
    assert isinstance(c, FreeModelsOnly) and c.covers("llama:free") and not c.covers("llama")


def test_unreadable_and_invalid_files(tmp_path):
    """A missing file and broken TOML both say which file and what is wrong."""
    with pytest.raises(ConfigError, match="cannot read config"):
        read_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("lanes = [\n")
    with pytest.raises(ConfigError, match="bad.toml: not valid TOML"):
        read_config(bad)


def test_free_lane_switch():
    """FREE_LANE=off (any casing, or 0/false/no) wins over the config."""
    config = load_config({}, env={})
    assert config.free_lane_on({}) is True
    for value in ("off", "OFF", "0", "false", "no"):
        assert config.free_lane_on({"FREE_LANE": value}) is False
    assert config.free_lane_on({"FREE_LANE": "on"}) is True
    assert load_config({"free_lane": False}, env={}).free_lane_on({}) is False


def test_state_is_a_file_or_a_redis_url():
    """`state` takes a SQLite path or a Redis URL; anything else names the key and expected form."""
    assert not load_config({"state": "~/lanes.db"}, env={}).shared_state
    assert load_config({"state": "redis://:${PW}@10.0.0.5:6380/2"}, env={"PW": "x"}).shared_state
    assert load_config({"state": "unix:///run/redis.sock"}, env={}).shared_state
    assert (
        'state: unsupported URL scheme "http"; expected a SQLite file path or redis://host:port/db'
        in error_of({"state": "http://10.0.0.5:6379"})
    )
    assert "state: a Redis URL needs a host, as in redis://127.0.0.1:6379/0" in error_of(
        {"state": "redis:///0"}
    )

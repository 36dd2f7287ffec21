"""Config loading: every shipped file is valid; every mistake names its key and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lanes import ConfigError, load_config, read_config
from lanes._core.freetier.kinds import CreditBased, FreeModelsOnly, RateLimitedFree

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
    """A malformed base URL names lanes.NAME.base_url, shows the value and the expected shape."""
    message = error_of(
        {"lanes": [{"name": "a"}, {"name": "b"}, {"name": "c", "base_url": "htp:/x"}]}
    )
    assert 'lanes.c.base_url: not a URL ("htp:/x"); expected https://host/path' in message


def test_unknown_keys_are_refused():
    """A misspelt key is refused with its path and the key that was meant."""
    message = error_of({"lanes": [{"name": "groq", "bsae_url": "https://x"}]})
    assert "lanes.groq.bsae_url: unknown key; did you mean base_url?" in message


def test_wrong_types_name_the_key():
    """A string where a number belongs names the key (the model by its id) and the expected
    type."""
    message = error_of({"lanes": [{"name": "g", "models": [{"id": "m", "context": "big"}]}]})
    assert 'lanes.g.models["m"].context: "big"' in message and "int" in message


def test_negative_limits_say_how_to_stop_tracking():
    """A negative quota names the key, the value and the fix."""
    message = error_of({"lanes": [{"name": "g", "free_tier": {"kind": "rate_limited", "rpm": -5}}]})
    assert (
        "lanes.g.free_tier.rpm: must be >= 0 (got -5); delete the key to stop tracking it"
        in message
    )


def test_unknown_free_tier_kind():
    """An unknown kind lists the kinds there are."""
    message = error_of({"lanes": [{"name": "g", "free_tier": {"kind": "gratis"}}]})
    assert '"gratis" is not a kind' in message and "rate_limited" in message


def test_duplicate_lane_names():
    """Two lanes with one name are refused."""
    assert 'lanes.g.name: "g" is used twice (lanes 1 and 2' in error_of(
        {"lanes": [{"name": "g"}, {"name": "g"}]}
    )


def test_every_problem_is_reported_at_once():
    """Mistakes in several lanes are listed together, one per line; top-level keys too."""
    message = error_of(
        {"lanes": [{"name": "x", "idle_s": 0}, {"name": "y", "base_url": "ftp://h"}]}
    )
    assert "lanes.x.idle_s: must be > 0 (got 0" in message
    assert "lanes.y.base_url: not a URL" in message
    assert "default_deadline_s: must be > 0 (got -1)" in error_of({"default_deadline_s": -1})


def test_env_interpolation():
    """${NAME} is replaced from the environment; a missing one names the key and the variable."""
    config = load_config(
        {"lanes": [{"name": "l", "base_url": "${LOCAL_URL}/v1"}]},
        env={"LOCAL_URL": "http://127.0.0.1:9"},
    )
    assert config.lanes[0].base_url == "http://127.0.0.1:9/v1"
    message = error_of({"lanes": [{"name": "l", "base_url": "${NOPE}"}]})
    assert "lanes.l.base_url: environment variable NOPE is not set" in message


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
        'state: unsupported URL scheme "http"; expected a SQLite file path, redis://host:port/db '
        "or redis+sentinel://host:port,host:port/service"
        in error_of({"state": "http://10.0.0.5:6379"})
    )
    assert "state: a Redis URL needs a host, as in redis://127.0.0.1:6379/0" in error_of(
        {"state": "redis:///0"}
    )


def test_a_sentinel_url_is_checked_when_the_config_is_read():
    """Each Sentinel is host:port and the database after the service a number: said naming the
    key when the config is read, not as `invalid literal for int()` at the first connection."""
    good = "redis+sentinel://:pw@10.0.0.5:26379,10.0.0.6:26379/mymaster/2"
    assert load_config({"state": good}, env={}).shared_state
    assert "each Sentinel is host:port ('localhost' is not)" in error_of(
        {"state": "redis+sentinel://localhost/mymaster"}
    )
    assert "the database after the service is a number" in error_of(
        {"state": "redis+sentinel://h:26379/mymaster/x"}
    )
    assert "names the master's service" in error_of({"state": "redis+sentinel://h:26379"})


def test_a_state_namespace_is_a_name():
    """`state_namespace` is a short name (it goes into every Redis key and the channel); anything
    else names the key and the form."""
    assert (
        load_config({"state_namespace": "team-a.prod_2"}, env={}).state_namespace == "team-a.prod_2"
    )
    for bad in ("x" * 65, "a b", "a}b", "-a", "a:b", "a*"):
        assert "state_namespace: " in error_of({"state_namespace": bad}), bad
    assert load_config({}, env={}).state_namespace == ""


# -- strictness: values of their key's type, names resolved, messages a person can act on --------


def check_cli(tmp_path: Path, text: str, capsys, env: dict[str, str] | None = None):
    """Run `lanes check-config` in-process on `text`; its exit code and what it printed."""
    from lanes._cli import main

    path = tmp_path / "lanes.toml"
    path.write_text(text)
    with pytest.MonkeyPatch.context() as patch:
        for name, value in (env or {}).items():
            patch.setenv(name, value)
        code = main(["check-config", str(path)])
    out = capsys.readouterr()
    return code, out.out + out.err


LANE = '[[lanes]]\nname = "groq"\n'


@pytest.mark.parametrize(
    ("text", "key", "fix"),
    [
        (
            LANE + '[[lanes.models]]\nid = "m"\nfree = "false"\n',
            'lanes.groq.models["m"].free',
            "false",
        ),
        ('log_bodies = "no"\n', "log_bodies", "false"),
        (LANE + '[[lanes.models]]\nid = "m"\nzdr = "no"\n', 'lanes.groq.models["m"].zdr', "false"),
        (LANE + 'enabled = "false"\n', "lanes.groq.enabled", "false"),
        ('free_lane = "false"\n', "free_lane", "false"),
        ('log_jobs = "yes"\n', "log_jobs", "true"),
    ],
)
def test_booleans_written_as_strings_are_refused(tmp_path, capsys, text, key, fix):
    """A quoted boolean (which Python reads as true) is refused by check-config with exit 2,
    naming the key by lane name and saying to write it without quotes."""
    code, said = check_cli(tmp_path, text, capsys)
    assert code == 2, said
    assert f"{key}: " in said and f"write {fix} without quotes" in said


@pytest.mark.parametrize(
    ("value", "expected"),
    [("0", False), ("false", False), ("No", False), ("OFF", False), ("1", True), ("Yes", True)],
)
def test_booleans_from_the_environment(value, expected):
    """After ${ENV} substitution true/false/1/0/yes/no/on/off (any case) are booleans."""
    config = load_config(
        {"free_lane": "${FREE}", "lanes": [{"name": "g", "enabled": "${ON}"}]},
        env={"FREE": value, "ON": value},
    )
    assert config.free_lane is expected and config.lanes[0].enabled is expected


def test_other_environment_words_are_refused():
    """Anything else from the environment is refused, naming the key and the accepted words."""
    message = error_of({"free_lane": "${FREE}"}, env={"FREE": "maybe"})
    assert 'free_lane: "maybe" (from the environment) is not a yes/no value' in message
    assert "true or false" in message


def test_numbers_only_as_numbers():
    """A quoted number is refused with the fix; from the environment it is read as a number; an
    int key refuses a fraction and a boolean."""
    message = error_of({"lanes": [{"name": "groq", "attempt_timeout_s": "30"}]})
    assert 'lanes.groq.attempt_timeout_s: "30" is text, not a number; write 30 without quotes' in (
        message
    )
    config = load_config(
        {"lanes": [{"name": "groq", "attempt_timeout_s": "${T}", "idle_s": 4}]}, env={"T": "7.5"}
    )
    assert config.lanes[0].attempt_timeout_s == 7.5 and config.lanes[0].idle_s == 4.0
    assert "policy.free_attempts: 1.5 is not a whole number" in error_of(
        {"policy": {"free_attempts": 1.5}}
    )
    assert "policy.max_attempts: true is not a whole number" in error_of(
        {"policy": {"max_attempts": True}}
    )
    assert "server.host: 8 is not text; write it in quotes" in error_of({"server": {"host": 8}})


def test_lists_and_choices_say_what_they_take():
    """A string where a list belongs is not split into characters; a wrong choice lists the
    choices and suggests the nearest."""
    message = error_of({"aliases": {"fast": "groq/llama"}})
    assert 'aliases.fast: "groq/llama" is not a list' in message
    message = error_of({"policy": {"free_tier_fallback": "alow"}})
    assert (
        'policy.free_tier_fallback: "alow" is not a choice here; use one of "off", "ask", "allow"'
        ' — did you mean "allow"?' in message
    )


@pytest.mark.parametrize(
    "source",
    [
        {"lanes": [{"name": "a"}, {"name": "b"}, {"name": "c"}, {"name": "d", "idle_s": "x"}]},
        {"policy": {"free_tier_fallback": "maybe"}},
        {"lanes": [{"name": "g", "free_tier": {"kind": "rate_limited", "rpm": "x"}}]},
        {"lanes": [{"name": "g", "free_tier": {"kind": "gratis"}}]},
        {"lanes": [{"name": "g", "free_tier": {"kind": "credits", "reset": "weekly"}}]},
        {"lanes": [{"name": "g", "free_tier": "rate_limited"}]},
    ],
)
def test_messages_show_no_python_internals(source):
    """No index for a named lane, no Python conversion text, no doubled path segment."""
    message = error_of(source)
    for internal in (
        "lanes[",
        "could not convert",
        "invalid literal",
        "Literal",
        "typing.",
        "free_tier.free_tier",
    ):
        assert internal not in message, message


def test_a_typo_suggests_the_key_that_was_meant():
    """Unknown keys, top-level or nested, name the nearest known key."""
    assert "polcy: unknown key; did you mean policy?" in error_of({"polcy": {}})
    assert "policy.free_atempts: unknown key; did you mean free_attempts?" in error_of(
        {"policy": {"free_atempts": 2}}
    )
    assert "lanes.g.breaker.cooldown: unknown key; did you mean cooldown_s?" in error_of(
        {"lanes": [{"name": "g", "breaker": {"cooldown": 3}}]}
    )
    assert "scoring.weights.relability: unknown key; did you mean reliability?" in error_of(
        {"scoring": {"weights": {"relability": 0.5}}}
    )


def test_an_unknown_lane_module_is_refused_with_the_nearest_name(tmp_path, capsys):
    """check-config refuses `name = "cerebrass"` with exit 2 and suggests the module meant."""
    code, said = check_cli(tmp_path, '[[lanes]]\nname = "cerebrass"\n', capsys)
    assert code == 2
    assert 'lanes.cerebrass.name: module lanes.cerebrass not found (did you mean "cerebras"?)' in (
        said
    )


async def test_startup_skips_a_missing_module_with_one_line(caplog):
    """At startup a missing lane module is one log line, never a refusal: lanes are deletable."""
    from lanes import open_dispatcher

    config = load_config(
        {
            "lanes": [
                {"name": "cerebrass"},
                {"name": "l", "module": "ollama", "models": [{"id": "m"}]},
            ]
        },
        env={},
    )
    async with open_dispatcher(config, env={}) as dispatcher:
        assert "not found" in dispatcher.statistics().unavailable["cerebrass"]
        assert list(dispatcher.lanes) == ["l"]


REFERENCES = (
    '[[lanes]]\nname = "groq"\n[[lanes.models]]\nid = "llama-3.1-8b-instant"\n'
    '[[lanes]]\nname = "ollama"\ndiscover = true\n'
)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            '[aliases]\nfast = ["groq/llama-3.1-8b-instant", "grok/x"]\n',
            'aliases.fast[1]: "grok/x" names lane "grok", which this config does not declare; '
            'did you mean "groq/x"?',
        ),
        (
            '[aliases]\nfast = ["groq/llama-3.1-8b"]\n',
            'aliases.fast[0]: "groq/llama-3.1-8b" names model "llama-3.1-8b", which lane groq '
            'does not offer; did you mean "groq/llama-3.1-8b-instant"?',
        ),
        (
            '[policy.classes]\ncoding = ["groq/nope"]\n',
            'policy.classes.coding[0]: "groq/nope" names model "nope", which lane groq does '
            "not offer",
        ),
        (
            '[policy.classes]\ncoding = ["openai/gpt"]\n',
            'policy.classes.coding[0]: "openai/gpt" names lane "openai", which this config does '
            "not declare",
        ),
        ('[aliases]\nfast = ["groq"]\n', 'aliases.fast[0]: "groq" is not "lane/model"'),
        ('[aliases]\nauto = ["groq/llama-3.1-8b-instant"]\n', 'aliases.auto: "auto" can not be'),
    ],
)
async def test_references_are_resolved_by_check_and_startup(tmp_path, capsys, text, said):
    """Aliases and request classes naming a lane or model that does not exist are refused by
    check-config (exit 2) and by startup alike, with the nearest name."""
    from lanes import open_dispatcher

    code, printed = check_cli(
        tmp_path, REFERENCES.replace("[[lanes]]", text + "[[lanes]]", 1), capsys
    )
    assert code == 2 and said in printed, printed
    with pytest.raises(ConfigError, match="bad config") as caught:
        async with open_dispatcher(tmp_path / "lanes.toml", env={"GROQ_API_KEY": "k"}):
            pass
    assert said in str(caught.value)


def test_a_discovering_lane_takes_any_model(tmp_path, capsys):
    """A lane that discovers its models can be named with a model the file does not list."""
    text = '[aliases]\nlocal = ["ollama/llama3.2:3b"]\n' + REFERENCES
    assert check_cli(tmp_path, text, capsys)[0] == 0


def test_free_lane_switch_in_the_environment_is_checked(tmp_path, capsys):
    """FREE_LANE must say on or off: anything else is refused, naming the variable."""
    code, said = check_cli(tmp_path, "", capsys, env={"FREE_LANE": "nope"})
    assert code == 2 and 'FREE_LANE (environment): "nope" is neither on nor off' in said


def test_shipped_config_passes_the_strict_check(capsys):
    """The shipped default config resolves every module and reference."""
    from lanes._cli import main

    assert main(["check-config", str(ROOT / "config" / "lanes.toml")]) == 0

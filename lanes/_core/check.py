"""The one check `lanes check-config` and startup share.

First the file itself: TOML, unknown keys, values of their key's type, ranges (`config.py`). Then
every name it refers to is resolved: each enabled lane's module, the lanes and models that aliases
and request classes name, and the `FREE_LANE` switch in the environment.

A lane module that can not be found is an error for `check-config` but only one log line at
startup: lanes are deletable, and a sidecar whose `lanes/groq.py` was removed must still start.
Every other problem stops both.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from lanes._core.config.schema import ADMIN_CLIENT, FLAG_WORDS, Config, read_config
from lanes._core.config.strict import key_of
from lanes._core.model.errors import ConfigError
from lanes._core.upstream.loader import find_provider
from lanes._core.upstream.spec import resolve


def _offered(config: Config) -> tuple[dict[str, set[str] | None], dict[str, str]]:
    """Per declared lane, the model ids it is known to offer (None: not knowable before it runs —
    the lane discovers its models, is disabled, or its module is missing); and the missing
    modules."""
    offered: dict[str, set[str] | None] = {}
    missing: dict[str, str] = {}
    for lane in config.lanes:
        offered[lane.name] = None
        if not lane.enabled:
            continue
        provider, why = find_provider(lane)
        if provider is None:
            missing[lane.name] = why
            continue
        if not lane.discover:
            offered[lane.name] = {m.id for m in resolve(provider, lane).models}
    return offered, missing


def _reference(key: str, value: str, offered: Mapping[str, set[str] | None]) -> str | None:
    """What is wrong with one `"lane/model"` reference, or None."""
    lane, sep, model = value.partition("/")
    if not sep or not lane or not model:
        return f'{key}: "{value}" is not "lane/model"; write the lane\'s name, a slash, the model'
    if lane not in offered:
        near = difflib.get_close_matches(lane, list(offered), n=1)
        hint = f'did you mean "{near[0]}/{model}"?' if near else "add the lane or remove the entry"
        return (
            f'{key}: "{value}" names lane "{lane}", which this config does not declare; {hint} '
            f"(lanes: {', '.join(offered) or 'none'})"
        )
    models = offered[lane]
    if models is None or model in models:
        return None
    near = difflib.get_close_matches(model, sorted(models), n=1)
    hint = (
        f'did you mean "{lane}/{near[0]}"?'
        if near
        else f"add it to [[lanes.models]] of lane {lane}, or set discover = true"
    )
    return (
        f'{key}: "{value}" names model "{model}", which lane {lane} does not offer; {hint} '
        f"(it offers: {', '.join(sorted(models)) or 'none'})"
    )


def check_references(config: Config, env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """Problems with the names `config` refers to, one line each; and the missing lane modules."""
    offered, missing = _offered(config)
    problems = []
    groups: list[tuple[str, Mapping[str, Sequence[str]]]] = [
        ("aliases", config.aliases),
        ("policy.classes", config.policy.classes),
    ]
    for where, table in groups:
        for name, keys in table.items():
            if where == "aliases" and (name == "auto" or "/" in name):
                problems.append(
                    f'{key_of(["aliases", name], None)}: "{name}" can not be an alias name '
                    '("auto" and "lane/model" already mean something); rename it'
                )
            for i, value in enumerate(keys):
                key = key_of([*where.split("."), name, i], None)
                if (problem := _reference(key, value, offered)) is not None:
                    problems.append(problem)
    for pattern, alias in config.alias_patterns.items():
        if alias not in config.aliases:
            near = difflib.get_close_matches(alias, list(config.aliases), n=1)
            hint = f'did you mean "{near[0]}"?' if near else "add it to [aliases]"
            problems.append(
                f'{key_of(["alias_patterns", pattern], None)}: "{alias}" is not an alias; {hint} '
                f"(aliases: {', '.join(config.aliases) or 'none'})"
            )
    problems += _client_names(config)
    flag = env.get("FREE_LANE")
    if flag is not None and flag.strip().lower() not in FLAG_WORDS:
        problems.append(
            f'FREE_LANE (environment): "{flag}" is neither on nor off; set FREE_LANE=off '
            "(or 0/false/no) to switch borrowed-free capacity off, =on (or unset it) to keep it"
        )
    return problems, missing


def _client_names(config: Config) -> list[str]:
    """A client named as the admin key's jobs are (`admin`) while there is an admin key: unless
    it is an admin itself, it would share their response cache entries, ceiling and audit."""
    server = config.server
    own = server.clients.get(ADMIN_CLIENT)
    if server.admin_key_env is None or own is None or own.admin:
        return []
    return [
        f"{key_of(['server', 'clients', ADMIN_CLIENT], None)}: the admin key's jobs are client "
        f'"{ADMIN_CLIENT}" (admin_key_env is set), and this client is no admin: it would be '
        "served the admin's cached answers and share its ceiling; rename it (or make it admin)"
    ]


def check_config(
    config: Config | str | os.PathLike[str],
    *,
    env: Mapping[str, str] | None = None,
    modules_required: bool = False,
) -> Config:
    """Read (when given a path) and check a config; the config that passed. Raises `ConfigError`
    listing every problem; with `modules_required` (as `lanes check-config` does) a missing lane
    module is one of them."""
    env = os.environ if env is None else env
    where = ""
    if not isinstance(config, Config):
        where = f"{Path(config)}: "
        config = read_config(config, env=env)
    problems, missing = check_references(config, env)
    if modules_required:
        problems += [
            f"lanes.{lane.name}.{'module' if lane.module else 'name'}: {missing[lane.name]}"
            for lane in config.lanes
            if lane.name in missing
        ]
    if problems:
        first = problems[0].partition(":")[0]
        raise ConfigError(f"{where}bad config:\n  " + "\n  ".join(problems), key=first)
    return config

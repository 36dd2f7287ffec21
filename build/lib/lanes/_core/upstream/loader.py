"""Finds lane modules by the names written in config. The only place that imports a lane module.

A lane that can not be loaded — module deleted, import broken, key variable unset or malformed
(`secrets.read_key`), its `Lane` class failing to build, disabled in config — costs one log line
and is left out; the rest start. Its settings are resolved once, by `spec.resolve`.
Startup never fails for a lane.
"""

from __future__ import annotations

import difflib
import importlib
import logging
import pkgutil
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

import attrs

from lanes._core.config.schema import Config, LaneConfig
from lanes._core.runtime.secrets import read_key
from lanes._core.upstream.client import Upstream
from lanes._core.upstream.lane import OpenAICompatibleLane, Secret
from lanes._core.upstream.spec import Provider, resolve

log = logging.getLogger("lanes")


@attrs.frozen(kw_only=True)
class Loaded:
    """The lanes that loaded, in config order, and why each other one did not."""

    lanes: tuple[OpenAICompatibleLane, ...]
    unavailable: Mapping[str, str]


def load_lanes(config: Config, *, upstream: Upstream, env: Mapping[str, str]) -> Loaded:
    lanes, unavailable = [], {}
    for lane_config in config.lanes:
        lane, reason = _load_one(lane_config, upstream, env)
        if lane is None:
            unavailable[lane_config.name] = reason
            log.warning("lane %s: %s", lane_config.name, reason)
        else:
            lanes.append(lane)
    return Loaded(lanes=tuple(lanes), unavailable=unavailable)


def shipped_lane_modules() -> list[str]:
    """The names of the lane modules in the `lanes` package (those a config can name bare)."""
    package = Path(__file__).resolve().parents[2]  # lanes/, found without importing it
    return sorted(
        m.name
        for m in pkgutil.iter_modules([str(package)])
        if not m.ispkg and not m.name.startswith("_")
    )


def find_module(config: LaneConfig) -> tuple[ModuleType | None, str]:
    """The lane's module, or None and why not (a missing module suggests the nearest name)."""
    path = config.module_path
    try:
        module = importlib.import_module(path)
    except ModuleNotFoundError as exc:
        if exc.name and (exc.name == path or path.startswith(exc.name + ".")):
            near = (
                difflib.get_close_matches(path.removeprefix("lanes."), shipped_lane_modules(), 1)
                if path.startswith("lanes.")
                else []
            )
            hint = f' (did you mean "{near[0]}"?)' if near else ""
            return None, f"module {path} not found{hint}"
        return None, f"module {path} failed to import ({type(exc).__name__}: {exc})"
    except Exception as exc:  # a broken lane module must not stop startup: it is one log line
        return None, f"module {path} failed to import ({type(exc).__name__})"
    if not isinstance(getattr(module, "PROVIDER", None), Provider):
        return None, f"module {path} declares no PROVIDER"
    return module, ""


def find_provider(config: LaneConfig) -> tuple[Provider | None, str]:
    """The lane module's `Provider`, or None and why it can not be had."""
    module, why = find_module(config)
    return (module.PROVIDER, "") if module is not None else (None, why)


def _load_one(
    config: LaneConfig, upstream: Upstream, env: Mapping[str, str]
) -> tuple[OpenAICompatibleLane | None, str]:
    if not config.enabled:
        return None, "disabled in config — skipped"
    module, why = find_module(config)
    if module is None:
        return None, f"{why} — skipped"
    spec = resolve(module.PROVIDER, config)
    api_key = None
    if spec.api_key_env and not config.byok:  # a bring-your-own-key lane's key comes with each job
        value, problem = read_key(env, spec.api_key_env)
        if value is None:
            return None, f"{problem} — lane off"
        api_key = Secret(value)
    lane_class = getattr(module, "Lane", OpenAICompatibleLane)
    try:
        lane = lane_class(spec, api_key=api_key, upstream=upstream)
    except Exception as exc:  # a lane module's own class must not stop startup either; its words
        # are not shown (they may hold the key it was given), only their type
        why = f"module {config.module_path}: its Lane failed to build ({type(exc).__name__})"
        return None, f"{why} — skipped"
    if not lane.candidates and not config.discover:
        return None, "no models configured (and discover is off) — skipped"
    return lane, ""

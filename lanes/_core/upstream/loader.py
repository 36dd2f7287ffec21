"""Finds lane modules by the names written in config. The only place that imports a lane module.

A lane that can not be loaded — module deleted, import broken, key variable unset or malformed
(`secrets.read_key`), disabled in config — costs one log line and is left out; the rest start.
Startup never fails for a lane.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping

import attrs

from lanes._core.config import Config, LaneConfig
from lanes._core.secrets import read_key
from lanes._core.upstream.client import Upstream
from lanes._core.upstream.lane import OpenAICompatibleLane, Provider, Secret

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


def _load_one(
    config: LaneConfig, upstream: Upstream, env: Mapping[str, str]
) -> tuple[OpenAICompatibleLane | None, str]:
    if not config.enabled:
        return None, "disabled in config — skipped"
    path = config.module_path
    try:
        module = importlib.import_module(path)
    except ModuleNotFoundError as exc:
        if exc.name and (exc.name == path or path.startswith(exc.name + ".")):
            return None, f"module {path} not found — skipped"
        return None, f"module {path} failed to import ({type(exc).__name__}: {exc}) — skipped"
    except Exception as exc:  # a broken lane module must not stop startup: it is one log line
        return None, f"module {path} failed to import ({type(exc).__name__}) — skipped"
    provider = getattr(module, "PROVIDER", None)
    if not isinstance(provider, Provider):
        return None, f"module {path} declares no PROVIDER — skipped"
    key_env = config.api_key_env if config.api_key_env is not None else provider.api_key_env
    api_key = None
    if key_env:
        value, problem = read_key(env, key_env)
        if value is None:
            return None, f"{problem} — lane off"
        api_key = Secret(value)
    lane_class = getattr(module, "Lane", OpenAICompatibleLane)
    lane = lane_class(provider=provider, config=config, api_key=api_key, upstream=upstream)
    if not lane.candidates and not config.discover:
        return None, "no models configured (and discover is off) — skipped"
    return lane, ""

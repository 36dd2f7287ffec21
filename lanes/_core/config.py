"""The configuration model: attrs classes structured by cattrs from TOML, unknown keys refused.

Every error names the key, the rule, the value and the fix, e.g.
`lanes[2].base_url: not a URL ("htp:/x"); expected https://host/path`.

`${NAME}` in any string is replaced by the environment variable NAME; a missing one is an error
naming the key. Secrets are never written in config: a lane names the *variable* that holds its key
(`api_key_env`), and the loader switches a lane off (one log line) when that variable is unset.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import attrs
import cattrs
from cattrs.errors import ForbiddenExtraKeysError
from cattrs.v import transform_error

from lanes._core.errors import ConfigError
from lanes._core.routing.breaker import BreakerPolicy
from lanes._core.routing.policy import PolicyConfig
from lanes._core.routing.scoring import ScoringConfig
from lanes._core.validators import non_negative, positive
from lanes.freetier.kinds import KINDS, FreeTierKind

T = TypeVar("T")
_URL = re.compile(r"^https?://[^/\s:]+(:\d+)?(/\S*)?$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
REDIS_SCHEMES = ("redis", "rediss", "unix")
_OFF = {"off", "0", "false", "no", "disabled"}


def _url(instance: object, attribute: attrs.Attribute[str | None], value: str | None) -> None:
    if value is not None and not _URL.match(value):
        raise ValueError(f'{attribute.name}: not a URL ("{value}"); expected https://host/path')


def _name(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not _NAME.match(value):
        raise ValueError(
            f'{attribute.name}: "{value}" is not a valid name; use lower-case letters, digits, '
            "'-', '_' or '.'"
        )


@attrs.frozen(kw_only=True)
class ModelConfig:
    """One model a lane offers. Prices in USD per million tokens; `free` None = the kind decides."""

    id: str
    free: bool | None = None
    context: int | None = attrs.field(default=None, validator=positive)
    input_usd_per_mtok: float | None = attrs.field(default=None, validator=non_negative)
    output_usd_per_mtok: float | None = attrs.field(default=None, validator=non_negative)
    zdr: bool = False  # the endpoint retains no data
    tools: bool | None = None  # capabilities; None = not known (not filtered on)
    vision: bool | None = None
    json_mode: bool | None = None
    prefill: bool | None = (
        None  # continues a trailing assistant message; None = the lane module's default
    )


@attrs.frozen(kw_only=True)
class LaneConfig:
    """One lane. Unset values fall back to the lane module's declared defaults."""

    name: str = attrs.field(validator=_name)
    module: str | None = None  # default: the lane's name; "pkg.mod" for a lane outside `lanes`
    enabled: bool = True
    base_url: str | None = attrs.field(default=None, validator=_url)
    api_key_env: str | None = None  # "" = no key needed
    free_tier: FreeTierKind | None = None
    models: list[ModelConfig] | None = None
    attempt_timeout_s: float = attrs.field(default=30.0, validator=positive)
    first_token_s: float = attrs.field(default=10.0, validator=positive)
    idle_s: float = attrs.field(default=10.0, validator=positive)
    min_useful_s: float = attrs.field(default=0.25, validator=non_negative)
    balance_poll_s: float = attrs.field(
        default=600.0, validator=positive
    )  # credits: how often to ask the balance
    discover: bool = (
        False  # fetch the provider's model list (in the background) and route to its free models
    )
    catalog_refresh_s: float = attrs.field(
        default=21_600.0, validator=positive
    )  # how often to fetch it again
    breaker: BreakerPolicy = attrs.field(factory=BreakerPolicy)
    headers: dict[str, str] = attrs.field(factory=dict)  # extra request headers (no secrets)
    # the most of an answer read (JSON: the whole body; streams: one event), decompressed
    max_response_bytes: int = attrs.field(default=8 * 1024 * 1024, validator=positive)
    max_event_bytes: int = attrs.field(default=1024 * 1024, validator=positive)

    @property
    def module_path(self) -> str:
        module = self.module or self.name
        return module if "." in module else f"lanes.{module}"


@attrs.frozen(kw_only=True)
class ServerConfig:
    """`[server]`: the sidecar's HTTP side."""

    host: str = "127.0.0.1"
    port: int = attrs.field(default=4098, validator=non_negative)
    max_body_bytes: int = attrs.field(default=4 * 1024 * 1024, validator=positive)
    keepalive_s: float = attrs.field(
        default=5.0, validator=positive
    )  # SSE comment while a stream waits
    clients: dict[str, str] = attrs.field(
        factory=dict
    )  # client name → env variable holding its key
    shutdown_grace_s: float = attrs.field(default=30.0, validator=non_negative)
    # connections: a request's headers must arrive, and an idle keep-alive connection is closed,
    # within idle_timeout_s; its body within body_timeout_s; at most max_connections at once
    # (and never more than the descriptor limit leaves room for: see _http/connections.py)
    idle_timeout_s: float = attrs.field(default=10.0, validator=positive)
    body_timeout_s: float = attrs.field(default=10.0, validator=positive)
    max_connections: int = attrs.field(default=4096, validator=positive)


@attrs.frozen(kw_only=True)
class Config:
    """The whole file. `lanes` are tried in the order written."""

    lanes: list[LaneConfig] = attrs.field(factory=list)
    aliases: dict[str, list[str]] = attrs.field(factory=dict)
    default_deadline_s: float = attrs.field(default=30.0, validator=positive)
    free_lane: bool = True  # FREE_LANE=off in the environment wins over this
    log_bodies: bool = False
    log_jobs: bool = (
        True  # one INFO line per job on the `lanes.jobs` logger (id, route, lane, outcome, ms)
    )
    state: str = attrs.field(
        default=":memory:"
    )  # the SQLite file shared on this host, or redis://host:port/db
    local_state: str = (
        ":memory:"  # with a Redis `state`: the SQLite file for this host's audit and canary answers
    )
    policy: PolicyConfig = attrs.field(factory=PolicyConfig)
    server: ServerConfig = attrs.field(factory=ServerConfig)
    scoring: ScoringConfig = attrs.field(factory=ScoringConfig)

    @state.validator
    def _state(self, attribute: attrs.Attribute[str], value: str) -> None:
        scheme, sep, rest = value.partition("://")
        if sep and scheme not in REDIS_SCHEMES:
            raise ValueError(
                f'state: unsupported URL scheme "{scheme}"; expected a SQLite file path or '
                "redis://host:port/db"
            )
        if sep and scheme != "unix" and not rest.split("/", 1)[0].rpartition("@")[2]:
            raise ValueError("state: a Redis URL needs a host, as in redis://127.0.0.1:6379/0")

    @property
    def shared_state(self) -> bool:
        """`state` names a Redis server shared by several hosts (rather than a SQLite file)."""
        return self.state.partition("://")[0] in REDIS_SCHEMES

    @lanes.validator
    def _unique(
        self, attribute: attrs.Attribute[list[LaneConfig]], value: list[LaneConfig]
    ) -> None:
        seen: set[str] = set()
        for i, lane in enumerate(value):
            if lane.name in seen:
                raise ValueError(
                    f'lanes[{i}].name: "{lane.name}" is used twice; lane names must be unique'
                )
            seen.add(lane.name)

    def free_lane_on(self, env: Mapping[str, str]) -> bool:
        """The kill switch: FREE_LANE=off (or 0/false/no) in `env` switches borrowed capacity
        off."""
        flag = env.get("FREE_LANE")
        if flag is not None and flag.strip().lower() in _OFF:
            return False
        return self.free_lane


def _converter() -> cattrs.Converter:
    converter = cattrs.Converter(forbid_extra_keys=True)

    def structure_kind(value: Any, _: Any) -> FreeTierKind:
        if not isinstance(value, Mapping) or "kind" not in value:
            raise ValueError(f"free_tier: needs a kind, one of {', '.join(KINDS)}")
        cls = KINDS.get(value["kind"])
        if cls is None:
            raise ValueError(
                f'free_tier.kind: "{value["kind"]}" is not a kind; '
                f"expected one of {', '.join(KINDS)}"
            )
        return converter.structure(value, cls)

    converter.register_structure_hook(FreeTierKind, structure_kind)
    converter.register_structure_hook(
        FreeTierKind | None, lambda value, _: None if value is None else structure_kind(value, None)
    )
    return converter


_CONVERTER = _converter()


def _format(exc: BaseException, type_: Any) -> str:
    if isinstance(exc, ForbiddenExtraKeysError):
        return f"unknown key(s) ({', '.join(sorted(exc.extra_fields))}); check the spelling"
    if isinstance(exc, KeyError):
        return "required key missing"
    if isinstance(exc, ValueError) and ":" in str(exc):
        return str(exc)  # our validators' own messages, which name the key
    if type_ is not None:
        name = getattr(type_, "__name__", None) or str(type_).replace("typing.", "")
        return f"expected {name} ({exc})" if str(exc) else f"expected {name}"
    return str(exc)


def _messages(exc: Exception) -> list[str]:
    out = []
    for line in transform_error(exc, path="", format_exception=_format):
        message, _, path = line.rpartition(" @ ")
        path = path.lstrip(".")
        head, sep, rest = message.partition(": ")
        if sep and re.fullmatch(r"[a-z_.\[\]0-9]+", head) and path:
            out.append(f"{path}.{head}: {rest}")
        else:
            out.append(f"{path}: {message}" if path else message)
    return out


def _interpolate(value: Any, env: Mapping[str, str], path: str) -> Any:
    if isinstance(value, str):

        def sub(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in env:
                raise ConfigError(
                    f"{path}: environment variable {name} is not set; set it or remove ${{{name}}}",
                    key=path,
                )
            return env[name]

        return _ENV.sub(sub, value)
    if isinstance(value, dict):
        return {k: _interpolate(v, env, f"{path}.{k}" if path else k) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, env, f"{path}[{i}]") for i, v in enumerate(value)]
    return value


def structure(
    raw: Mapping[str, Any],
    cls: type[T],
    *,
    converter: cattrs.Converter | None = None,
    what: str = "config",
) -> T:
    """Structure `raw` into `cls`, refusing unknown keys; `ConfigError` lists every problem at
    once."""
    try:
        return (converter or _CONVERTER).structure(raw, cls)
    except Exception as exc:  # cattrs wraps every problem; we re-raise them as one ConfigError
        messages = _messages(exc)
        raise ConfigError(f"bad {what}:\n  " + "\n  ".join(messages)) from exc


def read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A TOML file's contents; `ConfigError` naming the file when it can not be read or parsed."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config ({exc.strerror})") from exc
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from exc


def load_config(source: Mapping[str, Any], *, env: Mapping[str, str] | None = None) -> Config:
    """Structure a parsed TOML mapping into `Config`. Raises `ConfigError` listing every problem."""
    raw = _interpolate(dict(source), os.environ if env is None else env, "")
    return structure(raw, Config)


def read_config(path: str | os.PathLike[str], *, env: Mapping[str, str] | None = None) -> Config:
    """Read and check a TOML config file. Raises `ConfigError` naming the file and each key."""
    source = read_toml(path)
    try:
        return load_config(source, env=env)
    except ConfigError as exc:
        raise ConfigError(f"{Path(path)}: {exc}", key=exc.key) from exc

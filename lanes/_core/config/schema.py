"""The configuration model: attrs classes structured by cattrs from TOML, unknown keys refused.

Every error names the key (lanes by name), the rule, the value and the fix, e.g.
`lanes.groq.base_url: not a URL ("htp:/x"); expected https://host/path`; values must be of their
key's TOML type (`strict.py` says how they are read and how a problem is said).

`${NAME}` in any string is replaced by the environment variable NAME; a missing one is an error
naming the key. A substituted value may stand for a boolean (`true/false/1/0/yes/no/on/off`) or a
number. Secrets are never written in config: a lane names the *variable* that holds its key
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
from cattrs.gen import make_dict_structure_fn

from lanes._core.config.strict import FromEnv, Refused, key_of, messages, shown, strict_converter
from lanes._core.model.errors import ConfigError
from lanes._core.model.validators import at_least, at_most, non_negative, positive
from lanes._core.policy.breaker import BreakerPolicy
from lanes._core.policy.policy import PolicyConfig
from lanes._core.policy.scoring import ScoringConfig
from lanes._core.policy.spend import CAP_PARAMS
from lanes.freetier.kinds import KINDS, FreeTierKind

T = TypeVar("T")
_URL = re.compile(r"^https?://[^/\s:]+(:\d+)?(/\S*)?$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
REDIS_SCHEMES = ("redis", "rediss", "unix")
_OFF = {"off", "0", "false", "no", "disabled"}
FLAG_WORDS = _OFF | {"on", "1", "true", "yes", "enabled"}


_MODEL_ID = re.compile(r"[\x21-\x7e]{1,256}")


def _url(instance: object, attribute: attrs.Attribute[str | None], value: str | None) -> None:
    if value is not None and not _URL.match(value):
        raise ValueError(f'{attribute.name}: not a URL ("{value}"); expected https://host/path')


def _name(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not _NAME.match(value):
        raise ValueError(
            f'{attribute.name}: "{value}" is not a valid name; use lower-case letters, digits, '
            "'-', '_' or '.'"
        )


def _model_id(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not _MODEL_ID.fullmatch(value):
        raise ValueError(
            f"id: {value!r} is not a model id; use printable ASCII without spaces, at most 256 "
            "characters (it travels in headers and URLs)"
        )


@attrs.frozen(kw_only=True)
class ModelConfig:
    """One model a lane offers. Prices in USD per million tokens; `free` None = the kind decides."""

    id: str = attrs.field(validator=_model_id)
    free: bool | None = None
    context: int | None = attrs.field(default=None, validator=positive)
    # the most tokens it writes in one answer: a larger cap a client asks for is lowered to it
    max_output_tokens: int | None = attrs.field(default=None, validator=positive)
    input_usd_per_mtok: float | None = attrs.field(default=None, validator=non_negative)
    output_usd_per_mtok: float | None = attrs.field(default=None, validator=non_negative)
    zdr: bool = False  # the endpoint retains no data
    tools: bool | None = None  # capabilities; None = not known (not filtered on)
    vision: bool | None = None
    json_mode: bool | None = None
    prefill: bool | None = (
        None  # continues a trailing assistant message; None = the lane module's default
    )
    image_usd: float | None = attrs.field(default=None, validator=non_negative)  # per input image
    embedding: bool = False  # an embedding model: served on /v1/embeddings (and nowhere else)
    # takes chat's `reasoning_effort` (low/medium/high): a Responses or Messages request's effort
    # is sent to it, and to no model that does not declare this
    reasoning: bool = False


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
    # fetch the provider's model list (in the background) and route to its free models
    discover: bool = False
    byok: bool = False  # bring your own key: each client's request carries its provider key
    catalog_refresh_s: float = attrs.field(
        default=21_600.0, validator=positive
    )  # how often to fetch it again
    # the most discovered models kept as candidates (configured ones are never dropped): the rest
    # of a longer list is left out, with one log line naming the numbers
    max_models: int = attrs.field(default=1000, validator=positive)
    breaker: BreakerPolicy = attrs.field(factory=BreakerPolicy)
    headers: dict[str, str] = attrs.field(factory=dict)  # extra request headers (no secrets)
    # the output cap this provider honours (`max_tokens` or `max_completion_tokens`); unset: the
    # lane module's. A paid attempt sends its cap there and only there.
    output_cap: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.in_(CAP_PARAMS))
    )
    # request parameters that make this provider bill beyond the request, beside the lane module's
    # (taken out of free and credit attempts; a paid attempt carrying one is refused)
    billing_switches: list[str] = attrs.field(factory=list)
    # input tokens the provider adds to a request with tools; unset: the lane module's
    tool_prompt_tokens: int | None = attrs.field(default=None, validator=non_negative)
    # the most of an answer read (JSON: the whole body; streams: one event), decompressed
    max_response_bytes: int = attrs.field(default=8 * 1024 * 1024, validator=positive)
    max_event_bytes: int = attrs.field(default=1024 * 1024, validator=positive)

    @property
    def module_path(self) -> str:
        module = self.module or self.name
        return module if "." in module else f"lanes.{module}"


@attrs.frozen(kw_only=True)
class ClientConfig:
    """One client of the sidecar: `clients.NAME = "VAR"`, or a table `[server.clients.NAME]`."""

    key_env: str  # the environment variable holding the client's key
    admin: bool = False  # may switch lanes, decide approvals and revoke grants
    cohort: str | None = None  # the cohort of its jobs when a request names none
    # its own paid ceiling, inside the global one (None: only the global one)
    paid_ceiling_usd_per_day: float | None = attrs.field(default=None, validator=non_negative)
    # its own attempt governors, beside the global ones (None: none)
    attempts_per_minute: int | None = attrs.field(default=None, validator=at_least(1))
    attempts_per_day: int | None = attrs.field(default=None, validator=at_least(1))


@attrs.frozen(kw_only=True)
class ServerConfig:
    """`[server]`: the sidecar's HTTP side."""

    host: str = "127.0.0.1"
    port: int = attrs.field(default=4098, validator=non_negative)
    max_body_bytes: int = attrs.field(default=4 * 1024 * 1024, validator=positive)
    keepalive_s: float = attrs.field(
        default=5.0, validator=positive
    )  # SSE comment while a stream waits
    # client name → the env variable holding its key (or a table: key_env, admin)
    clients: dict[str, ClientConfig] = attrs.field(factory=dict)
    admin_key_env: str | None = None  # the env variable holding the admin key, if any
    shutdown_grace_s: float = attrs.field(default=30.0, validator=non_negative)
    # connections: a request's headers must arrive, and an idle keep-alive connection is closed,
    # within idle_timeout_s; its body within body_timeout_s; at most max_connections at once
    # (and never more than the descriptor limit leaves room for: see _http/connections.py)
    idle_timeout_s: float = attrs.field(default=10.0, validator=positive)
    body_timeout_s: float = attrs.field(default=10.0, validator=positive)
    max_connections: int = attrs.field(default=4096, validator=positive)


_COHORT = re.compile(r"[\x20-\x7e]{1,256}")


def _cohorts(instance: object, attribute: attrs.Attribute[list[str]], value: list[str]) -> None:
    for cohort in value:
        if not _COHORT.fullmatch(cohort) or cohort != cohort.strip():
            raise ValueError(
                f"{attribute.name}: {cohort!r} is not a cohort X-Lanes-Cohort can name; use "
                "printable ASCII, at most 256 characters, no leading or trailing space"
            )


@attrs.frozen(kw_only=True)
class MetricsConfig:
    """`[metrics]`: what `/metrics` and `/v1/lanes` show, and the cohorts clients may name."""

    # cohort labels /metrics shows (beside the clients' default cohorts, and what admins send)
    cohorts: list[str] = attrs.field(factory=list, validator=_cohorts)
    # per lane, the models shown one by one (the most used first); the rest summed up as `other`
    models_per_lane: int = attrs.field(default=50, validator=at_least(1))
    # distinct undeclared cohorts one client's jobs may name (per process); beyond, "other"
    cohorts_per_client: int = attrs.field(default=20, validator=non_negative)


_SERVICE = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]{0,126}[\x21-\x7e])?")


def _service(instance: object, attribute: attrs.Attribute[str | None], value: str | None) -> None:
    if value is not None and not _SERVICE.fullmatch(value):
        raise ValueError(
            f"{attribute.name}: {value!r} is not a service name; use printable ASCII, at most 128 "
            "characters, no leading or trailing space"
        )


@attrs.frozen(kw_only=True)
class TelemetryConfig:
    """`[telemetry]`: OpenTelemetry traces of every job, sent over OTLP/HTTP (the `otel` extra).
    Unset, the standard `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_SERVICE_NAME` variables apply."""

    #: the collector's OTLP/HTTP base URL, e.g. `http://127.0.0.1:4318` (traces go to its
    #: `/v1/traces`); unset: `OTEL_EXPORTER_OTLP_ENDPOINT`, else no traces
    otlp_endpoint: str | None = attrs.field(default=None, validator=_url)
    #: the `service.name` the spans carry; unset: `OTEL_SERVICE_NAME`, else `lanes`
    service_name: str | None = attrs.field(default=None, validator=_service)
    #: spans waiting for the collector, at most: beyond, a job's spans are dropped and counted
    queue_size: int = attrs.field(default=2048, validator=[at_least(1), at_most(100_000)])
    #: how long one export may take, seconds, retries included (a dead collector costs no more)
    export_timeout_s: float = attrs.field(default=10.0, validator=[positive, at_most(300.0)])


@attrs.frozen(kw_only=True)
class Config:
    """The whole file. `lanes` are tried in the order written."""

    lanes: list[LaneConfig] = attrs.field(factory=list)
    aliases: dict[str, list[str]] = attrs.field(factory=dict)
    # a model name no alias, lane/model or model id matches → the alias of the first glob it
    # matches, in the order written (`"claude-*haiku*" = "claude-haiku-4-5"`)
    alias_patterns: dict[str, str] = attrs.field(factory=dict)
    default_deadline_s: float = attrs.field(default=30.0, validator=positive)
    free_lane: bool = True  # FREE_LANE=off in the environment wins over this
    log_bodies: bool = False
    audit_days: float = attrs.field(
        default=30.0, validator=non_negative
    )  # 0: keep the audit forever
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
    metrics: MetricsConfig = attrs.field(factory=MetricsConfig)
    telemetry: TelemetryConfig = attrs.field(factory=TelemetryConfig)

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
        seen: dict[str, int] = {}
        for i, lane in enumerate(value):
            if lane.name in seen:
                raise ValueError(
                    f'lanes.{lane.name}.name: "{lane.name}" is used twice (lanes {seen[lane.name]}'
                    f" and {i + 1} in the file); lane names must be unique: rename one, and give "
                    f'it module = "{lane.module or lane.name}" to keep its module'
                )
            seen[lane.name] = i + 1

    def free_lane_on(self, env: Mapping[str, str]) -> bool:
        """The kill switch: FREE_LANE=off (or 0/false/no) in `env` switches borrowed capacity
        off."""
        flag = env.get("FREE_LANE")
        if flag is not None and flag.strip().lower() in _OFF:
            return False
        return self.free_lane


def _converter() -> cattrs.Converter:
    converter = strict_converter()
    kinds = ", ".join(f'"{k}"' for k in KINDS)

    def structure_kind(value: Any, _: Any) -> FreeTierKind:
        if not isinstance(value, Mapping) or "kind" not in value:
            raise Refused(f'needs a kind, as in {{ kind = "rate_limited" }}; kinds: {kinds}')
        cls = KINDS.get(value["kind"]) if isinstance(value["kind"], str) else None
        if cls is None:
            raise Refused(f"kind: {shown(value['kind'])} is not a kind; use one of {kinds}")
        return converter.structure(value, cls)

    client_table = make_dict_structure_fn(ClientConfig, converter, _cattrs_forbid_extra_keys=True)

    def structure_client(value: Any, _: Any) -> ClientConfig:
        if isinstance(value, str):
            return ClientConfig(key_env=value)
        return client_table(value, ClientConfig)

    converter.register_structure_hook(ClientConfig, structure_client)
    converter.register_structure_hook(FreeTierKind, structure_kind)
    converter.register_structure_hook(
        FreeTierKind | None, lambda value, _: None if value is None else structure_kind(value, None)
    )
    return converter


_CONVERTER = _converter()


def _interpolate(value: Any, env: Mapping[str, str], at: tuple[str | int, ...], root: Any) -> Any:
    if isinstance(value, str):

        def sub(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in env:
                key = key_of(list(at), root)
                raise ConfigError(
                    f"{key}: environment variable {name} is not set; set it or remove ${{{name}}}",
                    key=key,
                )
            return env[name]

        substituted = _ENV.sub(sub, value)
        return FromEnv(substituted) if _ENV.search(value) else substituted
    if isinstance(value, dict):
        return {k: _interpolate(v, env, (*at, k), root) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, env, (*at, i), root) for i, v in enumerate(value)]
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
        lines = messages(exc, raw)
        first = lines[0].partition(":")[0] if lines else None
        raise ConfigError(f"bad {what}:\n  " + "\n  ".join(lines), key=first) from exc


def packaged(name: str) -> Path:
    """A file shipped inside the package: `lanes.toml` (the default config), `canary.toml`."""
    return Path(__file__).resolve().parents[2] / "config" / name  # lanes/config/


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
    raw = _interpolate(dict(source), os.environ if env is None else env, (), source)
    return structure(raw, Config)


def read_config(path: str | os.PathLike[str], *, env: Mapping[str, str] | None = None) -> Config:
    """Read and check a TOML config file. Raises `ConfigError` naming the file and each key."""
    source = read_toml(path)
    try:
        return load_config(source, env=env)
    except ConfigError as exc:
        raise ConfigError(f"{Path(path)}: {exc}", key=exc.key) from exc

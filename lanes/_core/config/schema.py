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
from typing import Any, Literal, TypeVar

import attrs
import cattrs
from cattrs.gen import make_dict_structure_fn

from lanes._core.config.strict import FromEnv, Refused, key_of, messages, shown, strict_converter
from lanes._core.freetier.kinds import KINDS, FreeTierKind
from lanes._core.model.errors import ConfigError
from lanes._core.model.validators import at_least, at_most, non_negative, positive
from lanes._core.policy.breaker import BreakerPolicy
from lanes._core.policy.policy import PolicyConfig
from lanes._core.policy.scoring import ScoringConfig
from lanes._core.policy.spend import CAP_PARAMS

T = TypeVar("T")
#: The client the admin key's jobs are (`admin_key_env`): a client of that name must be an admin.
ADMIN_CLIENT = "admin"
#: The response cache's modes (`[cache] mode`, a client's `cache`).
CacheMode = Literal["off", "write_only", "on"]
_URL = re.compile(r"^https?://[^/\s:]+(:\d+)?(/\S*)?$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+sentinel")
NAMESPACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
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

    #: the model's id, as the provider names it
    id: str = attrs.field(validator=_model_id)
    #: `true`/`false`, honoured for every kind: `false` makes any model paid, `true` makes a model
    #: of a `none` or `free_models` lane borrowed-free; unset: the kind decides, and an unknown
    #: price is not free
    free: bool | None = None
    #: the context window, tokens
    context: int | None = attrs.field(default=None, validator=positive)
    #: the most tokens it writes in one answer: a larger cap a client asks for is lowered to it;
    #: discovered from a catalog's `max_completion_tokens`
    max_output_tokens: int | None = attrs.field(default=None, validator=positive)
    #: the input price, USD per million tokens
    input_usd_per_mtok: float | None = attrs.field(default=None, validator=non_negative)
    #: the output price, USD per million tokens
    output_usd_per_mtok: float | None = attrs.field(default=None, validator=non_negative)
    #: the endpoint retains no data (zero data retention)
    zdr: bool = False
    #: a capability: it calls tools (unset: not known, so not filtered on)
    tools: bool | None = None
    #: a capability: it reads images (unset: not known, so not filtered on)
    vision: bool | None = None
    #: a capability: it honours JSON mode (unset: not known, so not filtered on)
    json_mode: bool | None = None
    #: it continues a trailing assistant message, used to resume a broken stream (unset: the lane
    #: module's default)
    prefill: bool | None = None
    #: the most one input image costs, USD; a paid model without it is never sent images
    image_usd: float | None = attrs.field(default=None, validator=non_negative)
    #: an embedding model: served on `/v1/embeddings` and nowhere else (see
    #: [Embeddings](sidecar.md#embeddings))
    embedding: bool = False
    #: it takes chat's `reasoning_effort`: the effort a Responses or Messages request asks for —
    #: `reasoning.effort`, `output_config.effort` — is sent to it as `low`, `medium` or `high`,
    #: and to no model that does not declare this
    reasoning: bool = False


@attrs.frozen(kw_only=True)
class LaneConfig:
    """One lane. Unset values fall back to the lane module's declared defaults."""

    #: unique; also the module's name unless `module` is given
    name: str = attrs.field(validator=_name)
    #: the lane module: `groq` means `lanes.groq`; a dotted name (`mypkg.mylane`) loads a lane of
    #: your own
    #: default: its `name`
    module: str | None = None
    #: `false` leaves the lane out (one log line)
    enabled: bool = True
    #: the OpenAI-compatible base URL, e.g. `https://api.groq.com/openai/v1`
    #: default: the module's
    base_url: str | None = attrs.field(default=None, validator=_url)
    #: the environment variable holding the key; `""`: no key needed
    #: default: the module's
    api_key_env: str | None = None
    #: the free-tier kind, a table with `kind` (below)
    #: default: the module's
    free_tier: FreeTierKind | None = None
    #: the models this lane offers (`[[lanes.models]]`, below)
    #: default: the module's catalog
    models: list[ModelConfig] | None = None
    #: the longest one non-streamed attempt may take, seconds
    attempt_timeout_s: float = attrs.field(default=30.0, validator=positive)
    #: streams: the longest wait for the first chunk, seconds
    first_token_s: float = attrs.field(default=10.0, validator=positive)
    #: a cold or reopened free model gets one request first (a probe); the jobs waiting for it go
    #: once it answers (its whole answer, or a stream's first chunk), or this long after its
    #: request was handed to the operating system with no answer — a provider refuses (rate
    #: limit, model gone) before it works on a request. Seconds; raise it for a provider slow to
    #: refuse or a slow uplink (the socket's buffers may still hold a large request), or set it to
    #: `first_token_s` to hold them for the answer (up to `first_token_s`, as before)
    probe_quiet_s: float = attrs.field(default=0.5, validator=positive)
    #: streams: the longest silence between bytes once streaming, seconds
    idle_s: float = attrs.field(default=10.0, validator=positive)
    #: skip the lane when less time than this is left before the deadline, seconds
    min_useful_s: float = attrs.field(default=0.25, validator=non_negative)
    #: credit lanes whose `detection` is `provider_api` or `custom`: how often to ask the balance,
    #: seconds
    balance_poll_s: float = attrs.field(default=600.0, validator=positive)
    #: fetch the provider's model list at startup (in the background) and every
    #: `catalog_refresh_s`, and route to the free (or owned) models it lists beside the
    #: configured ones
    discover: bool = False
    #: bring your own key: the lane's key comes with each client's request
    #: (`X-Lanes-Key-<lane>`), for that job only — see
    #: [Reports](policy-and-money.md#reports-explain-every-cent)
    byok: bool = False
    #: how often to fetch the model list again, seconds (a 404 / model-not-found fetches it at
    #: once)
    catalog_refresh_s: float = attrs.field(default=21_600.0, validator=positive)
    #: the most models discovery keeps as candidates (in the list's order; configured models are
    #: always kept): a longer list's rest is left out, with one warning naming the lane and the
    #: numbers
    max_models: int = attrs.field(default=1000, validator=positive)
    #: the breaker of the lane, and of each of its models (`[lanes.breaker]`, below)
    breaker: BreakerPolicy = attrs.field(factory=BreakerPolicy)
    #: extra request headers (never secrets: use `api_key_env`)
    headers: dict[str, str] = attrs.field(factory=dict)
    #: the output cap this upstream honours, `max_tokens` or `max_completion_tokens`; a paid
    #: attempt sends its cap there, and only there
    #: default: the module's
    output_cap: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.in_(CAP_PARAMS))
    )
    #: request parameters that make this provider bill beyond the request (fallback models,
    #: plugins, searches), beside the ones the lane module declares: taken out of every attempt
    #: that is not paid or `byok`; a paid attempt carrying one is refused
    billing_switches: list[str] = attrs.field(factory=list)
    #: input tokens the provider adds itself to a request with tools (a tool-use system prompt),
    #: added to a paid or credit attempt's worst case
    #: default: the module's (else 1024)
    tool_prompt_tokens: int | None = attrs.field(default=None, validator=non_negative)
    #: the most of a JSON answer (a completion, the model list) read, decompressed: reading stops
    #: there and the attempt is a fault (the walk moves on; 502 when nothing else serves)
    max_response_bytes: int = attrs.field(default=8 * 1024 * 1024, validator=positive)
    #: the most one event of a stream may hold: a larger one is a fault
    max_event_bytes: int = attrs.field(default=1024 * 1024, validator=positive)

    @property
    def module_path(self) -> str:
        module = self.module or self.name
        return module if "." in module else f"lanes.{module}"


@attrs.frozen(kw_only=True)
class ClientConfig:
    """One client of the sidecar: `clients.NAME = "VAR"`, or a table `[server.clients.NAME]`."""

    #: the environment variable holding the client's key
    key_env: str
    #: `true` for a client that may act: switch lanes, decide approvals, revoke grants
    admin: bool = False
    #: its jobs' cohort when a request names none
    cohort: str | None = None
    #: its own paid ceiling per day, USD, inside the global one (unset: only the global one)
    paid_ceiling_usd_per_day: float | None = attrs.field(default=None, validator=non_negative)
    #: its own attempt governor, beside the global ones (unset: none)
    attempts_per_minute: int | None = attrs.field(default=None, validator=at_least(1))
    #: its own attempt governor, beside the global ones (unset: none)
    attempts_per_day: int | None = attrs.field(default=None, validator=at_least(1))
    #: the paid budget, USD, of each batch it creates without `metadata.lanes_max_paid_usd`
    #: (0: such batches never pay); see docs/batches.md
    batch_max_paid_usd: float = attrs.field(default=0.0, validator=[at_least(0.0), at_most(1000.0)])
    #: its own `[cache]` mode (`off`, `write_only`, `on`) over the section's (unset: the section's);
    #: the section's `off` keeps the cache off for every client
    cache: CacheMode | None = None


@attrs.frozen(kw_only=True)
class ServerConfig:
    """`[server]`: the sidecar's HTTP side."""

    #: the address to listen on (a non-loopback one needs client keys)
    host: str = "127.0.0.1"
    #: the port to listen on
    port: int = attrs.field(default=4098, validator=non_negative)
    #: the largest request body accepted
    max_body_bytes: int = attrs.field(default=4 * 1024 * 1024, validator=positive)
    #: a stream that waits sends an SSE comment after this much silence, seconds
    keepalive_s: float = attrs.field(default=5.0, validator=positive)
    #: client name → the environment variable holding its key, e.g.
    #: `clients = { ci = "LANES_KEY_CI" }`, or a table `[server.clients.NAME]` (below); keys are
    #: compared in constant time; with none, loopback callers are one anonymous client
    clients: dict[str, ClientConfig] = attrs.field(factory=dict)
    #: the environment variable holding the admin key, if any
    admin_key_env: str | None = None
    #: in-flight jobs may finish for this long after SIGTERM, seconds
    shutdown_grace_s: float = attrs.field(default=30.0, validator=non_negative)
    #: a request's headers must arrive, and an idle kept-alive connection is closed, within this,
    #: seconds — slow-loris clients are shed
    idle_timeout_s: float = attrs.field(default=10.0, validator=positive)
    #: a request's body must arrive within this, seconds, else 408
    body_timeout_s: float = attrs.field(default=10.0, validator=positive)
    #: open connections at once, and never more than half the descriptors the process may open;
    #: one more is answered 503 `too_many_connections` at once and closed
    # (the descriptor limit: see _http/connections.py)
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

    #: cohort names `/metrics` always labels, beside the clients' default cohorts; an admin's jobs
    #: may add up to 20 more
    cohorts: list[str] = attrs.field(factory=list, validator=_cohorts)
    #: per lane, the models `/v1/lanes`, the page and the per-model gauges show one by one (the
    #: most used first); the rest are summed up as `other`
    models_per_lane: int = attrs.field(default=50, validator=at_least(1))
    #: distinct cohorts not declared that one client's jobs may name in a process; a later new one
    #: is kept as `other` in the audit, the reports and `/metrics`, with one warning naming the
    #: client
    cohorts_per_client: int = attrs.field(default=20, validator=non_negative)


_SERVICE = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]{0,126}[\x21-\x7e])?")


def _service(instance: object, attribute: attrs.Attribute[str | None], value: str | None) -> None:
    if value is not None and not _SERVICE.fullmatch(value):
        raise ValueError(
            f"{attribute.name}: {value!r} is not a service name; use printable ASCII, at most 128 "
            "characters, no leading or trailing space"
        )


def _sentinel_url(rest: str) -> None:
    """A Sentinel URL's hosts (each host:port) and service (then an optional database number),
    checked here rather than at the first connection."""
    example = "redis+sentinel://10.0.0.5:26379,10.0.0.6:26379/mymaster"
    hosts, _, path = rest.partition("?")[0].partition("/")
    service, _, db = path.partition("/")
    if not service:
        raise ValueError(
            f"state: a Sentinel URL names the master's service after the hosts, as in {example}"
        )
    for one in hosts.rpartition("@")[2].split(","):
        name, sep, port = one.rpartition(":")
        if not sep or not name or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"state: each Sentinel is host:port ({one!r} is not), as in {example}")
    if db.strip("/") and not db.strip("/").isdigit():
        raise ValueError(f"state: the database after the service is a number, as in {example}/2")


@attrs.frozen(kw_only=True)
class BatchConfig:
    """`[batch]`: work that can wait — OpenAI's Batch API (`/v1/files`, `/v1/batches`), served on
    free capacity as it resets. Items never pay."""

    #: serve `/v1/files` and `/v1/batches` and run their items; `false`: those routes answer 404
    enabled: bool = True
    #: where the queue keeps its files and items (the one place request bodies are stored); empty:
    #: beside the SQLite `state` (`<state>.batches/`); with the state in memory, a temporary
    #: folder, and a batch says it does not survive a restart. With a Redis `state` the queue, its
    #: files' bytes included, is in Redis (one for every host), and this folder only holds uploads
    #: while they arrive (empty: a temporary folder)
    folder: str = ""
    #: an uploaded file's size, at most, MB
    max_file_mb: float = attrs.field(default=200.0, validator=[positive, at_most(10_000.0)])
    #: the bytes of the files a client keeps at once (those `/v1/files` lists), at most, MB: with
    #: a Redis `state` they are held in Redis beside the ledger
    max_client_mb: float = attrs.field(default=1000.0, validator=[positive, at_most(1_000_000.0)])
    #: an uploaded file's lines, at most
    max_lines: int = attrs.field(default=50_000, validator=[at_least(1), at_most(10_000_000)])
    #: items running at once
    concurrency: int = attrs.field(default=4, validator=[at_least(1), at_most(256)])
    #: days a batch is kept after it ended — with its items, its output and error files and its
    #: input file (the request bodies); then deleted
    retention_days: float = attrs.field(default=7.0, validator=[positive, at_most(3650.0)])
    #: the share of every free quota (per minute, per day, credits) batch items leave to
    #: interactive work: at 0.2 a batch stops where 20 % of a quota is left, and waits for its reset
    headroom: float = attrs.field(default=0.2, validator=[at_least(0.0), at_most(0.9)])
    #: while a batch has items left, interactive jobs try first the free quotas its items may not
    #: use (the headroom), then those it would use up first; `false`: their order stays as it is
    #: without a batch
    spare: bool = True


@attrs.frozen(kw_only=True)
class CacheConfig:
    """`[cache]`: answer a repeated request once — an exact response cache, scoped per client key,
    off by default. Only whole successes are stored; a hit costs no quota and no money. Stored
    answers hold the answers' text: turn it on only where keeping them is allowed (see
    docs/cache.md)."""

    #: `off`: nothing is read or written (a request can not opt in); `write_only`: answers are
    #: stored, and read only by a request that sends `X-Lanes-Cache: on`; `on`: cacheable requests
    #: read and write
    mode: CacheMode = "off"
    #: how long an answer is served again, seconds
    ttl_s: float = attrs.field(default=86_400.0, validator=[positive, at_most(365 * 86_400.0)])
    #: the stored answers' bytes, at most, MB: beyond, the oldest are evicted first
    max_mb: float = attrs.field(default=256.0, validator=[positive, at_most(100_000.0)])
    #: one answer's bytes, at most, KB: a larger answer is not stored
    max_entry_kb: int = attrs.field(default=1024, validator=[at_least(1), at_most(65_536)])
    #: cache requests that do not ask for determinism too (no `temperature = 0`, no `seed`); by
    #: default only those that do are cacheable (others answer `bypass`), unless a request sends
    #: `X-Lanes-Cache: on`
    any_sampling: bool = False
    #: store answers that paid fallback served, and serve them again to the same client (never to
    #: work that may not pay); `false`: a paid answer is never stored
    keep_paid: bool = False


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

    #: the lanes, tried in the order written (`[[lanes]]`, below)
    lanes: list[LaneConfig] = attrs.field(factory=list)
    #: logical model names → ordered `"lane/model"` lists, e.g.
    #: `fast = ["groq/llama-3.1-8b-instant", "openai/gpt-4.1-mini"]`; Claude-style names for
    #: Messages API clients are aliases too (`"claude-haiku-4-5" = [...]`; a dated name finds its
    #: alias without the date); for embeddings an alias declares its candidates the same model
    aliases: dict[str, list[str]] = attrs.field(factory=dict)
    #: globs → aliases, for model names nothing else matches: the first glob (in the order
    #: written, case-sensitive) that a name matches gives its alias, e.g.
    #: `"claude-*opus*" = "claude-opus-4-7"`; an alias, a `lane/model` or a model id of that exact
    #: name wins. The shipped config (and `--simulate`) map `claude-*haiku*`, `claude-*sonnet*`,
    #: `claude-*opus*` to their tier's alias and any other `claude-*` to `claude-sonnet-4-6`, and
    #: Gemini CLI's names (`gemini-*lite*`, `gemini-*flash*`, `gemini-*pro*`) likewise
    alias_patterns: dict[str, str] = attrs.field(factory=dict)
    #: a job's deadline when the caller gives none, seconds
    default_deadline_s: float = attrs.field(default=30.0, validator=positive)
    #: `false` switches off borrowed-free capacity, as `FREE_LANE=off` in the environment does
    #: (which wins over this)
    free_lane: bool = True
    #: keep prompt and answer bodies in the audit (otherwise only SHA-256 and byte counts)
    log_bodies: bool = False
    #: how long the audit keeps a job, days (deleted hourly in the background); `0` keeps it
    #: forever
    audit_days: float = attrs.field(default=30.0, validator=non_negative)
    #: one INFO line per job on the `lanes.jobs` logger: id, model asked, route, what served it,
    #: attempts, outcome, ms, the fields a translated request dropped (never a body)
    log_jobs: bool = True
    #: where shared state lives: a SQLite file (usage counters, credit spend, header snapshots,
    #: backoffs, probe leases, the paid ledger, grants and pending approvals, the runtime kill
    #: switch, the canary's quarantine, the audit) that every process on the host opening the
    #: same file shares (`~` is expanded; a `<state>-changes` file beside it tells them of new
    #: switches and backoffs); or `redis://[:password@]host:port/db` (also `rediss://`,
    #: `unix://`; `redis+sentinel://host:port,host:port/service[/db]` follows the master Sentinel
    #: names) for several hosts — see
    #: [Running several sidecars](operations.md#running-several-sidecars). In memory, nothing
    #: survives a restart (under `--workers N`, a private file the workers share for the run)
    state: str = attrs.field(default=":memory:")
    #: with a Redis `state`: the SQLite file for what stays on this host — the audit and the
    #: canary's answers
    local_state: str = ":memory:"
    #: with a Redis `state`: how many replicas must have a paid reservation (`WAIT`, within
    #: 1 s) before the paid request is sent — so a failover to one of them loses none; `0` sends
    #: at once (a lost write is then put back by the hosts that made it, at the next sync)
    state_redis_min_replicas: int = attrs.field(default=0, validator=attrs.validators.in_(range(6)))
    #: with a Redis `state`: this deployment's name on the server (letters, digits, `_ . -`, up to
    #: 64). Every key is `lanes:{<name>}:…` and every event is published on this deployment's own
    #: channel, so two deployments on one server — one database or two — share nothing. Empty:
    #: keys `lanes:…`, one channel per database
    state_namespace: str = attrs.field(default="")
    #: the free-first policy (`[policy]`, below)
    policy: PolicyConfig = attrs.field(factory=PolicyConfig)
    #: the sidecar (`[server]`, below)
    server: ServerConfig = attrs.field(factory=ServerConfig)
    #: how free candidates are ranked (`[scoring]`, below)
    scoring: ScoringConfig = attrs.field(factory=ScoringConfig)
    #: what `/metrics` and `/v1/lanes` show, and the cohorts clients may name (`[metrics]`, below)
    metrics: MetricsConfig = attrs.field(factory=MetricsConfig)
    #: OpenTelemetry traces of every job, to an OTLP/HTTP collector (`[telemetry]`, below)
    telemetry: TelemetryConfig = attrs.field(factory=TelemetryConfig)
    #: work that can wait: batches on free capacity (`[batch]`, below)
    batch: BatchConfig = attrs.field(factory=BatchConfig)
    #: an exact response cache, per client key, off by default (`[cache]`, below)
    cache: CacheConfig = attrs.field(factory=CacheConfig)

    @state.validator
    def _state(self, attribute: attrs.Attribute[str], value: str) -> None:
        scheme, sep, rest = value.partition("://")
        if sep and scheme not in REDIS_SCHEMES:
            raise ValueError(
                f'state: unsupported URL scheme "{scheme}"; expected a SQLite file path, '
                "redis://host:port/db or redis+sentinel://host:port,host:port/service"
            )
        if sep and scheme != "unix" and not rest.split("/", 1)[0].rpartition("@")[2]:
            raise ValueError("state: a Redis URL needs a host, as in redis://127.0.0.1:6379/0")
        if scheme == "redis+sentinel":
            _sentinel_url(rest)

    @state_namespace.validator
    def _namespace(self, attribute: attrs.Attribute[str], value: str) -> None:
        if value and not NAMESPACE.fullmatch(value):
            raise ValueError(
                f"state_namespace: {value[:80]!r} is not a name (letters, digits, `_`, `.`, `-`, "
                "1 to 64, starting with a letter or digit)"
            )

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
